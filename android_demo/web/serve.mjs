#!/usr/bin/env node
/**
 * Serve the built page (dist/) and an artifact folder (under /artifact/) on 127.0.0.1, with the
 * COOP/COEP headers that make the page crossOriginIsolated (so ORT may use WASM threads).
 *
 *   node serve.mjs --artifact DIR [--port 8080] [--host 127.0.0.1] [--no-isolation]
 *   then open http://127.0.0.1:8080/?artifact=/artifact/
 *
 * Also used by test/browser.mjs (startServer) and by `npm run dev` (artifactMiddleware, with
 * SPECMEMO_ARTIFACT=DIR).
 */
import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { createServer } from 'node:http';
import { extname, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

export const DIST = fileURLToPath(new URL('./dist/', import.meta.url));

export const ISOLATION_HEADERS = {
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Embedder-Policy': 'require-corp',
  'Cross-Origin-Resource-Policy': 'same-origin',
};

const TYPES = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript', '.mjs': 'text/javascript', '.css': 'text/css',
  '.wasm': 'application/wasm', '.json': 'application/json', '.png': 'image/png', '.svg': 'image/svg+xml',
};

/** `rest` inside `root`, or null for a path that leaves it. */
function inside(root, rest) {
  const file = resolve(root, rest);
  return file === root || file.startsWith(root + sep) ? file : null;
}

async function sendFile(req, res, file, headers) {
  const info = file && (await stat(file).catch(() => null));
  if (!info?.isFile()) {
    res.writeHead(404, { 'Content-Type': 'text/plain', ...headers }).end('not found\n');
    return;
  }
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    res.writeHead(405, { 'Content-Type': 'text/plain', Allow: 'GET, HEAD', ...headers }).end('method not allowed\n');
    return;
  }
  // No Cache-Control: no-store here: with it, Chromium aborted some of the page's parallel fetches
  // (net::ERR_ABORTED) in the browser test.
  res.writeHead(200, { 'Content-Type': TYPES[extname(file)] ?? 'application/octet-stream', 'Content-Length': info.size, ...headers });
  if (req.method === 'HEAD') res.end();
  else createReadStream(file).pipe(res);
}

function decodedPath(url) {
  try {
    return decodeURIComponent(new URL(url ?? '/', 'http://x').pathname);
  } catch {
    return null;
  }
}

/** Connect-style middleware: /artifact/<file> from `dir`, everything else to next(). */
export function artifactMiddleware(dir, headers = ISOLATION_HEADERS) {
  const root = resolve(dir);
  return (req, res, next) => {
    const path = decodedPath(req.url);
    if (path === null || !path.startsWith('/artifact/')) return next();
    void sendFile(req, res, inside(root, path.slice('/artifact/'.length)), headers);
  };
}

/** Serve `dist` at / and `artifact` at /artifact/ (and a `gguf` file at /gguf/<its name>, for the peer's
 * page); resolves to { server, url } once listening. */
export async function startServer({ artifact, gguf, dist = DIST, port = 0, host = '127.0.0.1', isolation = true, onRequest } = {}) {
  const headers = isolation ? ISOLATION_HEADERS : {};
  const root = resolve(dist);
  const artifacts = artifact ? artifactMiddleware(artifact, headers) : (req, res, next) => next();
  const ggufPath = gguf ? `/gguf/${encodeURIComponent(resolve(gguf).split(sep).at(-1))}` : null;
  const server = createServer((req, res) => {
    onRequest?.(req);
    if (ggufPath !== null && new URL(req.url ?? '/', 'http://x').pathname === ggufPath) {
      void sendFile(req, res, resolve(gguf), headers);
      return;
    }
    artifacts(req, res, () => {
      const path = decodedPath(req.url);
      void sendFile(req, res, path === null ? null : inside(root, path === '/' ? 'index.html' : path.slice(1)), headers);
    });
  });
  await new Promise((ok, bad) => server.once('error', bad).listen(port, host, ok));
  return { server, url: `http://${host}:${server.address().port}` };
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const { values } = parseArgs({
    options: {
      artifact: { type: 'string' },
      port: { type: 'string', default: '8080' },
      host: { type: 'string', default: '127.0.0.1' },
      'no-isolation': { type: 'boolean', default: false },
    },
  });
  if (!(await stat(`${DIST}index.html`).catch(() => null))) {
    console.error('serve: dist/index.html is missing: run `npm run build` first');
    process.exit(1);
  }
  const { url } = await startServer({ artifact: values.artifact, port: Number(values.port), host: values.host, isolation: !values['no-isolation'] });
  console.log(values.artifact ? `open ${url}/?artifact=/artifact/  (${resolve(values.artifact)})` : `open ${url}/ and pick an artifact folder`);
}
