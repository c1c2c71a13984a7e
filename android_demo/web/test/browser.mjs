#!/usr/bin/env node
/**
 * The page in headless Chromium, end to end: serve web/dist and an artifact folder on 127.0.0.1,
 * open /?artifact=/artifact/, wait for the engine, send each message, wait for the reply.
 *
 *   node test/browser.mjs --artifact DIR --message TEXT [--message TEXT ...] --screenshot PNG
 *        [--mode auto|tree|plain] [--max-new-tokens N] [--threads N] [--no-isolation]
 *        [--stop-after-tokens N] [--pick] [--model-format onnx|ort] [--chromium /usr/bin/chromium] [--timeout SECONDS]
 *        [--new-chat-each] [--visits N] [--budget MIB] [--expect-error] [--recall] [--format text|json]
 *        [--param NAME=VALUE ...]   (another URL parameter: temperature=0, seed=3, ...)
 *   node test/browser.mjs --gguf FILE --message TEXT ... --screenshot PNG   # the peer's page (wllama.html)
 *
 * Prints one JSON line per message: {"ids": [...], "text": "...", "state": "...", "interrupted":
 * bool, "stats": "...", "ms": N, "frames": N}; "frames" counts animation frames that painted a
 * partial reply (the page stays live while generating). The first line also carries "loadMs",
 * "crossOriginIsolated" and "threads". --stop-after-tokens N: the page clicks Stop in the first frame that shows
 * the first reply's N-th token. Each line also has "timing" (tokens, ttftMs, decodeMs: the page's own clock) and
 * "peakRssBytes" (the renderer process's VmHWM so far). --new-chat-each starts every message in a new
 * chat (first turns). --visits N opens the page N times in one browser profile and prints one
 * {"visit": i, "loadMs", "networkBytes", "cacheBytes"} line each, after one reply to the first message (model
 * files over the network vs read
 * from the page's Cache Storage; manifest.json, which names the cache, left out). --budget passes
 * ?budget=<MiB>; --recall passes ?recall=on (each line then has "recall", the store after the reply, and the
 * first "recallAtOpen", the store the page read back); --expect-error prints {"error": "..."} for a page that
 * refuses (exit 0). Exits 1 with a
 * one-line error on a timeout, a page error, a console error, or the page's error state. --pick opens the artifact through the folder picker
 * (<input webkitdirectory>, files read from disk by the browser) instead of ?artifact=/artifact/.
 *
 * The server sends COOP/COEP headers (the page is crossOriginIsolated, so ORT may use WASM threads)
 * unless --no-isolation. No browser is downloaded: playwright-core drives the Chromium given.
 */
import { readFile, stat } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

import { DIST, startServer } from '../serve.mjs';

process.env.PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD = '1';

function fail(message) {
  process.stderr.write(`browser test: ${String(message).split('\n')[0]}\n`);
  process.exit(1);
}

let args;
try {
  ({ values: args } = parseArgs({
    options: {
      artifact: { type: 'string' },
      gguf: { type: 'string' },
      message: { type: 'string', multiple: true },
      screenshot: { type: 'string' },
      mode: { type: 'string' },
      'max-new-tokens': { type: 'string' },
      threads: { type: 'string' },
      'stop-after-tokens': { type: 'string' },
      pick: { type: 'boolean', default: false },
      'model-format': { type: 'string' },
      'no-isolation': { type: 'boolean', default: false },
      chromium: { type: 'string', default: '/usr/bin/chromium' },
      timeout: { type: 'string', default: '300' },
      'new-chat-each': { type: 'boolean', default: false },
      visits: { type: 'string', default: '1' },
      budget: { type: 'string' },
      'expect-error': { type: 'boolean', default: false },
      recall: { type: 'boolean', default: false },
      format: { type: 'string' },
      param: { type: 'string', multiple: true }, // NAME=VALUE: another URL parameter (temperature=0, seed=3, ...)
    },
  }));
} catch (error) {
  process.stderr.write(`browser test: ${error.message}\n`);
  process.exit(2);
}
if (!(args.artifact || args.gguf) || !args.message?.length || !args.screenshot) {
  process.stderr.write('usage: node test/browser.mjs --artifact DIR (or --gguf FILE) --message TEXT --screenshot PNG [--mode auto|tree|plain] [--max-new-tokens N]\n');
  process.exit(2);
}

const deadline = Date.now() + Number(args.timeout) * 1000;
const left = () => Math.max(1, deadline - Date.now());

// -------------------------------------------------------------------------------------------------
// The browser

/** Bytes of model files `page` receives over the network (its network log; manifest.json, which names the
 * page's cache, left out): `.n`, growing as responses finish. */
function countModelBytes(page) {
  const bytes = { n: 0 };
  page.on('requestfinished', async (req) => {
    const path = new URL(req.url()).pathname;
    if (path.startsWith('/artifact/') && !path.endsWith('/manifest.json')) bytes.n += (await req.sizes()).responseBodySize;
  });
  return bytes;
}

let browser = null;
let server = null;
let page = null;
const timer = setTimeout(() => {
  process.stderr.write(`browser test: timed out after ${args.timeout} s\n`);
  browser?.close().catch(() => {});
  server?.close();
  process.exit(1);
}, left());
timer.unref();

async function main() {
  const wanted = args.gguf ? ['the GGUF', resolve(args.gguf)] : ['the artifact', join(resolve(args.artifact), 'manifest.json')];
  for (const [what, path] of [['web/dist (run `npm run build`)', join(DIST, 'index.html')], wanted]) {
    if (!(await stat(path).catch(() => null))) throw new Error(`${path} is missing: ${what}`);
  }
  if (!(await stat(args.chromium).catch(() => null))) throw new Error(`${args.chromium} is missing: install Debian's chromium (apt-get install chromium) or pass --chromium`);
  let chromium;
  try {
    ({ chromium } = await import('playwright-core'));
  } catch {
    throw new Error('playwright-core is not installed: run `make js-setup` (npm ci in android_demo/web)');
  }
  let base;
  ({ server, url: base } = await startServer({ artifact: args.artifact, gguf: args.gguf, isolation: !args['no-isolation'] }));
  const pagePath = args.gguf ? 'wllama.html' : '';

  browser = await chromium.launch({ executablePath: args.chromium, headless: true, args: ['--no-sandbox'], timeout: left() });
  const context = await browser.newContext({ viewport: { width: 900, height: 760 } });
  const cdp = await browser.newBrowserCDPSession();
  const query = new URLSearchParams(args.gguf ? { model: `/gguf/${encodeURIComponent(basename(args.gguf))}` }
    : args.pick ? {} : { artifact: '/artifact/' });
  if (args.mode) query.set('mode', args.mode);
  if (args['max-new-tokens']) query.set('max-new-tokens', args['max-new-tokens']);
  if (args.threads) query.set('threads', args.threads);
  if (args['model-format']) query.set('model-format', args['model-format']);
  if (args.budget) query.set('budget', args.budget);
  if (args.recall) query.set('recall', 'on');
  if (args.format) query.set('format', args.format);
  for (const pair of args.param ?? []) {
    const at = pair.indexOf('=');
    if (at < 1) fail(`--param ${pair}: give NAME=VALUE`);
    query.set(pair.slice(0, at), pair.slice(at + 1));
  }
  for (let visit = 1; visit < Number(args.visits); visit++) { // earlier visits: how each loads
    const earlier = await context.newPage();
    const bytes = countModelBytes(earlier);
    const t0 = Date.now();
    await earlier.goto(`${base}/${pagePath}?${query}`, { timeout: left() });
    await earlier.waitForFunction(() => ['ready', 'error'].includes(document.body.dataset.state), undefined, { timeout: left(), polling: 50 });
    const loadMs = Date.now() - t0;
    const loaded = JSON.parse(await earlier.evaluate(() => document.body.dataset.loaded ?? '{}'));
    if (await earlier.evaluate(() => document.body.dataset.state === 'ready')) { // a visit uses the page: one reply
      await earlier.fill('#message', args.message[0]);
      await earlier.click('#send');
      await earlier.waitForFunction(() => document.body.dataset.replyIds !== undefined || document.body.dataset.state === 'error',
        undefined, { timeout: left(), polling: 50 });
    }
    process.stdout.write(`${JSON.stringify({ visit, loadMs, networkBytes: bytes.n, cacheBytes: loaded.cache ?? 0 })}\n`);
    await earlier.close();
  }
  page = await context.newPage();
  const networkBytes = countModelBytes(page);
  const problems = [];
  page.on('console', (msg) => {
    if (msg.type() === 'error') problems.push(`console error: ${msg.text()}`);
  });
  page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
  if (process.env.BROWSER_TEST_DEBUG) page.on('request', (r) => process.stderr.write(`request ${r.url()}\n`));
  // A HEAD (the page sizing a file before it loads it) is reported aborted by Chromium once its headers
  // arrive: the page got what it asked for.
  page.on('requestfailed', (req) => {
    if (req.method() !== 'HEAD') problems.push(`request failed: ${req.url()} (${req.failure()?.errorText})`);
  });
  /** The renderer's peak RSS (VmHWM) so far: the largest over the browser's renderer processes. */
  const peakRss = async () => {
    const { processInfo } = await cdp.send('SystemInfo.getProcessInfo');
    let peak = 0;
    for (const info of processInfo.filter((p) => p.type === 'renderer')) {
      const status = await readFile(`/proc/${info.id}/status`, 'utf8').catch(() => '');
      peak = Math.max(peak, 1024 * Number(/VmHWM:\s+(\d+) kB/.exec(status)?.[1] ?? 0));
    }
    return peak;
  };
  const check = async () => {
    if (problems.length) throw new Error(problems[0]);
    const state = await page.evaluate(() => document.body.dataset.state);
    if (state === 'error') throw new Error(`page error state: ${await page.textContent('#error')}`);
  };

  const started = Date.now();
  await page.goto(`${base}/${pagePath}?${query}`, { timeout: left() });
  if (args.pick) await page.setInputFiles('#folder', resolve(args.artifact), { timeout: left() });
  const settled = (states) => page.waitForFunction(
    (wanted) => wanted.includes(document.body.dataset.state), states, { timeout: left(), polling: 50 });
  await settled(['ready', 'error']);
  if (args['expect-error']) {
    const error = await page.evaluate(() => document.body.dataset.state === 'error' ? document.getElementById('error')?.textContent : null);
    if (error === null) throw new Error('the page opened, but --expect-error expected it to refuse');
    process.stdout.write(`${JSON.stringify({ error, plan: JSON.parse(await page.evaluate(() => document.body.dataset.plan ?? 'null')) })}\n`);
    await page.screenshot({ path: args.screenshot, fullPage: true });
    return;
  }
  await check();
  const loadMs = Date.now() - started;
  const env = await page.evaluate(() => ({ crossOriginIsolated: self.crossOriginIsolated, log: document.getElementById('engine-log')?.textContent ?? '' }));
  const threads = Number(/(\d+) WASM thread/.exec(env.log)?.[1] ?? NaN);
  const recallAtOpen = JSON.parse(await page.evaluate(() => document.body.dataset.recall ?? 'null'));

  const lines = [];
  for (const [i, message] of args.message.entries()) {
    const t0 = Date.now();
    if (args['new-chat-each'] && i > 0) await page.click('#new-chat');
    await page.fill('#message', message);
    // Stop (--stop-after-tokens) is clicked by the page itself, in the first frame that paints the
    // reply's N-th token: a click sent from here can arrive after a small model's whole reply.
    const stopAt = i === 0 && args['stop-after-tokens'] ? Number(args['stop-after-tokens']) : 0;
    await page.evaluate((stopAt) => {
      delete document.body.dataset.replyIds;
      // Count the frames that show a reply still streaming (the page is not blocked while generating).
      const sampler = { frames: 0, stopped: false };
      window.__frames = sampler;
      const frame = () => {
        const last = [...document.querySelectorAll('.msg.assistant')].at(-1);
        const tokens = Number(last?.dataset.tokens ?? 0);
        if (document.body.dataset.state === 'generating' && tokens > 0) {
          sampler.frames++;
          if (stopAt && tokens >= stopAt && !sampler.stopped) {
            sampler.stopped = true;
            document.getElementById('stop').click();
          }
        }
        if (document.body.dataset.replyIds === undefined && document.body.dataset.state !== 'error') requestAnimationFrame(frame);
      };
      requestAnimationFrame(frame);
    }, stopAt);
    await page.click('#send');
    await page.waitForFunction(
      () => document.body.dataset.state === 'error' || (document.body.dataset.state === 'ready' && document.body.dataset.replyIds !== undefined),
      undefined, { timeout: left(), polling: 50 });
    await check();
    const reply = await page.evaluate(() => {
      const last = [...document.querySelectorAll('.msg.assistant')].at(-1);
      return {
        ids: JSON.parse(document.body.dataset.replyIds ?? 'null'),
        text: last?.querySelector('.text')?.textContent ?? '',
        state: document.body.dataset.state,
        interrupted: document.body.dataset.replyInterrupted === 'true',
        frames: window.__frames?.frames ?? 0,
        stats: last?.querySelector('.stats')?.textContent ?? '',
        timing: JSON.parse(document.body.dataset.replyTiming ?? 'null'),
        recall: JSON.parse(document.body.dataset.recall ?? 'null'),
      };
    });
    const line = { ...reply, ms: Date.now() - t0, peakRssBytes: await peakRss() };
    if (i === 0) {
      const loaded = JSON.parse(await page.evaluate(() => document.body.dataset.loaded ?? '{}'));
      Object.assign(line, { loadMs, crossOriginIsolated: env.crossOriginIsolated, threads, networkBytes: networkBytes.n,
        cacheBytes: loaded.cache ?? 0, curveKept: env.log.includes('verify latency curve: kept'), recallAtOpen });
    }
    lines.push(line);
  }
  await page.screenshot({ path: args.screenshot, fullPage: true });
  await check();
  for (const line of lines) process.stdout.write(`${JSON.stringify(line)}\n`);
}

try {
  await main();
} catch (error) {
  await page?.screenshot({ path: args.screenshot, fullPage: true, timeout: 10_000 }).catch(() => {}); // to see what went wrong
  await browser?.close().catch(() => {});
  server?.close();
  fail(error?.message ?? error);
}
await browser.close();
server.close();
