/**
 * The page's build. Three things beyond a plain Vite app:
 *  - `@specmemo/engine` is the shared engine's TypeScript source (../engine/src), bundled in; its
 *    imports (@huggingface/tokenizers, @huggingface/jinja, onnxruntime-common) resolve from this
 *    folder's node_modules (`dedupe`), whether or not ../engine/node_modules exists.
 *  - onnxruntime-web's WASM runtime (`import 'onnxruntime-web/wasm'`: the WASM backend only) (ort-wasm-simd-threaded.mjs + .wasm) is served by the page itself
 *    under /ort/ (dev: from node_modules; build: copied into dist/ort/); main.ts points
 *    `ort.env.wasm.wasmPaths` there. No CDN.
 *  - COOP/COEP headers in dev and preview, so the page is crossOriginIsolated and ORT may use threads.
 *  - With SPECMEMO_ARTIFACT=<folder>, dev and preview also serve that folder under /artifact/
 *    (open /?artifact=/artifact/).
 */
import { createReadStream } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { defineConfig, type Plugin } from 'vite';

import { artifactMiddleware } from './serve.mjs'; // plain JavaScript, also run by node; its types: serve.d.mts

const here = fileURLToPath(new URL('.', import.meta.url));
const engine = fileURLToPath(new URL('../engine/', import.meta.url));
const ortDist = fileURLToPath(new URL('./node_modules/onnxruntime-web/dist/', import.meta.url));

/** The files `import 'onnxruntime-web/wasm'` loads at run time (the plain SIMD build, threads optional). */
export const ORT_RUNTIME_FILES = ['ort-wasm-simd-threaded.mjs', 'ort-wasm-simd-threaded.wasm'];

const ISOLATION_HEADERS = {
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Embedder-Policy': 'require-corp',
};

function ortRuntimeFiles(): Plugin {
  return {
    name: 'specmemo-ort-runtime-files',
    configureServer(server) {
      if (process.env.SPECMEMO_ARTIFACT) server.middlewares.use(artifactMiddleware(process.env.SPECMEMO_ARTIFACT));
      // Before Vite's own middlewares, so the .mjs is served as-is (not transformed as app code).
      server.middlewares.use((req, res, next) => {
        const name = (req.url ?? '').split('?')[0].replace(/^\/ort\//, '');
        if (!req.url?.startsWith('/ort/') || !ORT_RUNTIME_FILES.includes(name)) return next();
        res.setHeader('Content-Type', name.endsWith('.wasm') ? 'application/wasm' : 'text/javascript');
        // server.headers do not reach this early middleware; the .mjs is also ORT's worker script,
        // which a crossOriginIsolated page only runs if it carries COEP itself.
        for (const [key, value] of Object.entries(ISOLATION_HEADERS)) res.setHeader(key, value);
        createReadStream(ortDist + name).pipe(res);
      });
    },
    configurePreviewServer(server) {
      if (process.env.SPECMEMO_ARTIFACT) server.middlewares.use(artifactMiddleware(process.env.SPECMEMO_ARTIFACT));
    },
    async generateBundle() {
      for (const name of ORT_RUNTIME_FILES) {
        this.emitFile({ type: 'asset', fileName: `ort/${name}`, source: await readFile(ortDist + name) });
      }
    },
  };
}

export default defineConfig({
  root: here,
  base: './',
  plugins: [ortRuntimeFiles()],
  resolve: {
    alias: [
      { find: /^@specmemo\/engine$/, replacement: `${engine}src/index.ts` },
      // The build that loads its WASM glue from wasmPaths (the default "bundle" build embeds the glue
      // and makes Vite emit a second copy of the .wasm through `new URL(..., import.meta.url)`).
      { find: /^onnxruntime-web\/wasm$/, replacement: `${ortDist}ort.wasm.min.mjs` },
    ],
    dedupe: ['@huggingface/tokenizers', '@huggingface/jinja', 'onnxruntime-common'],
  },
  optimizeDeps: { exclude: ['onnxruntime-web'] },
  server: { headers: ISOLATION_HEADERS, fs: { allow: [here, engine] } },
  preview: { headers: ISOLATION_HEADERS },
  build: {
    outDir: 'dist', emptyOutDir: true, target: 'es2022', chunkSizeWarningLimit: 2048,
    // the page, and the peer's page `specmemo bench web` measures it against (wllama on the same GGUF)
    rollupOptions: { input: { main: `${here}index.html`, wllama: `${here}wllama.html` } },
  },
});
