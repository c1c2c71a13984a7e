// The types of what vite.config.ts imports from serve.mjs (plain JavaScript, also run by node).
import type { Connect } from 'vite';

/** Serves the artifact folder `dir` under /artifact/ with `headers` (default: the COOP/COEP/CORP isolation headers);
 * other requests go to `next`. */
export declare function artifactMiddleware(dir: string, headers?: Record<string, string>): Connect.NextHandleFunction;
