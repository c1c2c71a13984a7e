/**
 * The page: open an artifact (a picked folder, or `?artifact=<url>`), then chat with it on one
 * ChatSession, tokens streaming into the log.
 *
 * URL parameters: params.ts.
 *
 * For tests: <body data-state="idle|loading|ready|generating|error">; after each reply
 * body.dataset.replyIds is the reply's token ids as JSON (and replyInterrupted "true"/"false"),
 * body.dataset.replyTiming {tokens, ttftMs, decodeMs}; body.dataset.plan the memory plan (memory.ts) and
 * body.dataset.loaded {network, cache} bytes of the last opening; the streaming reply's bubble counts its
 * tokens in data-tokens; errors are shown in #error; body.dataset.recall {held, written, bytes} of the recall
 * store after opening and after each reply ("null" with recall off).
 */
import * as ort from 'onnxruntime-web/wasm';
import { ChatSession, SHARED, describe, modeOf, openEngine, type Engine, type Mode } from '@specmemo/engine';

import { allocationMessage, budgetBytes, planSource, type PagePlan } from './memory';
import { forThePage } from './ortSessions';
import { loadGrammar } from './grammar';
import { intParam, modelFormat, params, recallBudget, replyFormat, samplingParams } from './params';
import { statsLine } from './replyStats';
import { PickedFolderSource, UrlSource, type Progress } from './sources';

import { CurveStore } from './curves';
import { RecallFileInIndexedDB } from './recallFile';

type State = 'idle' | 'loading' | 'ready' | 'generating' | 'error';

function $<T extends HTMLElement>(id: string): T {
  const el = document.getElementById(id);
  if (!el) throw new Error(`#${id} is missing from index.html`);
  return el as T;
}

const ui = {
  folder: $<HTMLInputElement>('folder'),
  mode: $<HTMLSelectElement>('mode'),
  format: $<HTMLSelectElement>('format'),
  maxNewTokens: $<HTMLInputElement>('max-new-tokens'),
  status: $('status'),
  progress: $<HTMLProgressElement>('progress'),
  plan: $('plan'),
  error: $('error'),
  log: $('log'),
  form: $<HTMLFormElement>('composer'),
  message: $<HTMLTextAreaElement>('message'),
  send: $<HTMLButtonElement>('send'),
  stop: $<HTMLButtonElement>('stop'),
  newChat: $<HTMLButtonElement>('new-chat'),
  forget: $<HTMLButtonElement>('forget'),
  engineLog: $('engine-log'),
  ortVersion: $('ort-version'),
};

// ---------------------------------------------------------------------------------------------------
// Settings: URL parameters first, then the controls

/** The controls' values from the URL (bad values are reported like any other error). */
function applyParams(): void {
  ui.maxNewTokens.value = String(SHARED.max_new_tokens.chat); // the chat's default, as `specmemo chat`'s
  ui.format.value = replyFormat();
  const mode = params.get('mode');
  if (mode !== null) {
    ui.mode.value = modeOf(mode); // an older name ('greedy') picks the mode it names now
  }
  const maxNewTokens = intParam('max-new-tokens');
  if (maxNewTokens !== undefined) ui.maxNewTokens.value = String(maxNewTokens);
}

/** The recall store's state for tests and the plan line (null with recall off). */
function showRecall(): void {
  const store = engine?.recall ?? null;
  document.body.dataset.recall = JSON.stringify(store && { held: store.held, written: store.written, bytes: store.nbytes });
  ui.forget.hidden = store === null;
}

/**
 * WASM threads need SharedArrayBuffer, which a browser gives only a crossOriginIsolated page (served
 * with COOP: same-origin and COEP: require-corp). Otherwise one thread.
 */
function threadCount(): number {
  const asked = intParam('threads');
  if (!self.crossOriginIsolated) {
    if (asked !== undefined && asked > 1) logLine(`threads=${asked} ignored: the page is not crossOriginIsolated (serve it with COOP/COEP headers)`);
    return 1;
  }
  return asked ?? Math.max(1, Math.min(4, navigator.hardwareConcurrency || 1));
}

// ---------------------------------------------------------------------------------------------------
// State and messages

let engine: Engine | null = null;
let curves: CurveStore | null = null; // the latency curve kept for this artifact's next visit
let source: PickedFolderSource | UrlSource | null = null; // kept to reopen with another mode
let chat: ChatSession | null = null;
let generation: AbortController | null = null;
let readyStatus = 'Ready.'; // what the status line says between replies

function setState(state: State): void {
  document.body.dataset.state = state;
  const ready = state === 'ready';
  ui.message.disabled = !ready && state !== 'generating';
  ui.send.disabled = !ready;
  ui.stop.disabled = state !== 'generating';
  ui.newChat.disabled = ui.forget.disabled = !ready;
  ui.folder.disabled = state === 'loading' || state === 'generating';
  ui.mode.disabled = ui.maxNewTokens.disabled = ui.folder.disabled;
}

function setStatus(text: string): void {
  ui.status.textContent = text;
}

function showError(error: unknown): void {
  const message = error instanceof Error ? error.message : String(error);
  ui.error.textContent = message;
  ui.error.hidden = false;
  setStatus('Error.');
  setState('error');
  console.warn(`[specmemo] ${message}`); // a warning: the page shows it; tests read #error
}

function logLine(line: string): void {
  ui.engineLog.textContent += `${line}\n`;
}

function megabytes(bytes: number): string {
  return `${(bytes / 2 ** 20).toFixed(bytes < 10 * 2 ** 20 ? 2 : 1)} MB`;
}

/** Bytes of the last opening, by where they came from (body.dataset.loaded). */
const loaded = { network: 0, cache: 0 };

/** Progress over all files in flight, as a bar and a line: "Downloading decoder.onnx.data: 12.0 / 540.0 MB
 * (+1 file)", or "Reading … from the browser's cache". */
function progressReporter(): (p: Progress) => void {
  const files = new Map<string, Progress>();
  let last = 0;
  return (p) => {
    const before = files.get(p.file)?.loaded ?? 0;
    loaded[p.cached ? 'cache' : 'network'] += p.loaded - before;
    document.body.dataset.loaded = JSON.stringify(loaded);
    files.set(p.file, p);
    const busy = [...files.values()].filter((f) => f.total === null || f.loaded < f.total);
    const now = performance.now();
    if (busy.length && now - last < 100) return; // at most ~10 updates a second
    last = now;
    if (!busy.length) {
      ui.progress.hidden = true;
      return setStatus('Loading graphs…');
    }
    const sum = busy.reduce((s, f) => s + f.loaded, 0);
    const total = busy.every((f) => f.total !== null) ? busy.reduce((s, f) => s + (f.total ?? 0), 0) : null;
    const biggest = busy.reduce((a, b) => ((b.total ?? b.loaded) > (a.total ?? a.loaded) ? b : a));
    const more = busy.length > 1 ? ` (+${busy.length - 1} file${busy.length > 2 ? 's' : ''})` : '';
    ui.progress.hidden = false;
    if (total) {
      ui.progress.max = total;
      ui.progress.value = sum;
    } else {
      ui.progress.removeAttribute('value'); // indeterminate
    }
    const verb = biggest.cached ? 'Reading' : 'Downloading';
    const where = biggest.cached ? " from the browser's cache" : '';
    setStatus(`${verb} ${biggest.file}${more}${where}: ${megabytes(sum)}${total ? ` / ${megabytes(total)}` : ''}`);
  };
}

/** The memory plan for `opened` before its graphs load (memory.ts), with `recall` bytes (a recall store's, or
 * none) set apart from the budget before the KV cache is fitted; refused in one line when the model cannot fit. */
async function planFor(opened: PickedFolderSource | UrlSource, mode: Mode, recall: number | null): Promise<PagePlan> {
  const deviceMemory = (navigator as Navigator & { deviceMemory?: number }).deviceMemory;
  const budget = budgetBytes(params.get('budget'), deviceMemory);
  const plan = await planSource(opened, { mode, drafter: params.get('drafter') ?? undefined,
    budget: budget === null ? null : budget - (recall ?? 0), capacity: intParam('capacity') });
  document.body.dataset.plan = JSON.stringify(plan);
  if (!plan.fits) throw new Error(plan.text);
  return plan;
}

function bubble(role: 'user' | 'assistant', text: string): HTMLDivElement {
  const div = document.createElement('div');
  div.className = `msg ${role}`;
  const body = document.createElement('div');
  body.className = 'text';
  body.textContent = text;
  div.append(body);
  ui.log.append(div);
  scrollToEnd(true);
  return div;
}

/** Keep the newest text in view, unless the user scrolled up to read. */
function scrollToEnd(always = false): void {
  const log = ui.log;
  if (always || log.scrollHeight - log.scrollTop - log.clientHeight < 80) log.scrollTop = log.scrollHeight;
}

// ---------------------------------------------------------------------------------------------------
// Opening an artifact

ort.env.wasm.wasmPaths = new URL('ort/', document.baseURI).href; // served by the page (vite.config.ts)
ort.env.logLevel = 'error'; // a page's console is its user's: errors only (runs too: engine/src/session.ts)
ui.ortVersion.textContent = ort.env.versions.web ?? '';
const engineOrt = forThePage(ort); // the page kept responsive between steps: see ortSessions.ts

function newChat(): void {
  if (!engine) return;
  const maxNewTokens = Number(ui.maxNewTokens.value);
  chat = new ChatSession(engine, { system: params.get('system') ?? undefined, maxNewTokens: maxNewTokens >= 1 ? maxNewTokens : undefined });
  ui.log.replaceChildren();
  delete document.body.dataset.replyIds;
}

async function open(makeSource: () => PickedFolderSource | UrlSource): Promise<void> {
  generation?.abort();
  const previous = engine;
  engine = null;
  chat = null;
  ui.error.hidden = true;
  ui.plan.textContent = '';
  ui.log.replaceChildren();
  delete document.body.dataset.replyIds;
  setState('loading');
  let plan: PagePlan | null = null;
  loaded.network = loaded.cache = 0;
  try {
    await previous?.close();
    const opened = makeSource();
    source = opened;
    const threads = threadCount();
    ort.env.wasm.numThreads = threads;
    const mode = ui.mode.value as Mode;
    logLine(`opening ${opened.where} (mode ${mode}, ${threads} WASM thread${threads > 1 ? 's' : ''}, crossOriginIsolated ${self.crossOriginIsolated})`);
    setStatus(`Opening ${opened.where}…`);
    const started = performance.now();
    const recall = recallBudget();
    plan = await planFor(opened, mode, recall);
    if (plan.lowered) logLine(`memory: ${plan.text}`);
    curves = await CurveStore.open(opened, threads);
    const latencyCurve = curves?.curve;
    if (latencyCurve) logLine('verify latency curve: kept from an earlier visit');
    if (curves?.route) logLine('numeric route: kept from an earlier visit');
    engine = await openEngine({
      ort: engineOrt,
      source: opened,
      mode,
      drafter: params.get('drafter') ?? undefined,
      sizes: plan.budget !== null ? plan.sizes : undefined, // fitted to the budget (memory.ts), else the engine's own
      capacity: intParam('capacity'),
      modelFormat: modelFormat(),
      threads,
      latencyCurve,
      route: curves?.route,
      grammar: loadGrammar,
      sampling: samplingParams(),
      recall: recall === null ? undefined : { file: new RecallFileInIndexedDB(opened.where), budget: recall },
      log: (line) => {
        logLine(line);
        if (document.body.dataset.state === 'loading') setStatus(line);
      },
    });
    curves?.keepRoute(engine.route);
    newChat();
    showRecall();
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    ui.plan.textContent = `Memory plan: ${engine.plan.summary} · ${plan.text}`;
    readyStatus = `Ready: ${opened.where}, mode ${engine.mode}, ${describe(engine.sampling)}, ${threads} thread${threads > 1 ? 's' : ''} (opened in ${seconds} s).`;
    setStatus(readyStatus);
    logLine(`ready in ${seconds} s`);
    setState('ready');
    ui.message.focus();
  } catch (error) {
    ui.progress.hidden = true;
    showError(allocationMessage(error, plan));
  }
}

ui.folder.addEventListener('change', () => {
  const files = ui.folder.files;
  if (files && files.length) void open(() => new PickedFolderSource(files));
});

// ---------------------------------------------------------------------------------------------------
// Chatting

async function send(text: string): Promise<void> {
  if (!chat || document.body.dataset.state !== 'ready' || !text.trim()) return;
  const session = chat;
  bubble('user', text);
  const answer = bubble('assistant', '');
  const body = answer.querySelector('.text') as HTMLDivElement;
  answer.classList.add('streaming');
  ui.message.value = '';
  generation = new AbortController();
  setState('generating');
  setStatus('Generating…');
  const sent = performance.now();
  const times: number[] = [];
  try {
    const reply = await session.send(text, {
      signal: generation.signal,
      constraint: ui.format.value === 'json' ? { kind: 'json_object' } : undefined,
      onToken: (_id, soFar) => {
        times.push(performance.now());
        body.textContent = soFar;
        scrollToEnd();
        answer.dataset.tokens = String(Number(answer.dataset.tokens ?? 0) + 1);
      },
    });
    body.textContent = reply.text;
    const stats = document.createElement('div');
    stats.className = 'stats';
    stats.textContent = statsLine(reply, session) + (reply.interrupted ? ' · stopped' : '');
    answer.append(stats);
    document.body.dataset.replyInterrupted = String(reply.interrupted);
    showRecall();
    document.body.dataset.replyIds = JSON.stringify(reply.tokenIds);
    curves?.keep(engine?.latencyCurve ?? null);
    document.body.dataset.replyTiming = JSON.stringify({
      tokens: times.length, ttftMs: times.length ? times[0] - sent : null,
      decodeMs: times.length > 1 ? times[times.length - 1] - times[0] : null,
    });
    setStatus(reply.interrupted ? `Stopped. ${readyStatus}` : readyStatus);
    setState('ready');
  } catch (error) {
    showError(error);
  } finally {
    answer.classList.remove('streaming');
    scrollToEnd();
    generation = null;
  }
  if (document.body.dataset.state === 'ready') ui.message.focus();
}

ui.form.addEventListener('submit', (event) => {
  event.preventDefault();
  void send(ui.message.value);
});
ui.message.addEventListener('keydown', (event) => {
  if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    void send(ui.message.value);
  }
});
ui.stop.addEventListener('click', () => generation?.abort());
ui.newChat.addEventListener('click', () => {
  chat?.reset();
  ui.log.replaceChildren();
  delete document.body.dataset.replyIds;
  setStatus('New chat: the KV cache is empty.');
});
ui.forget.addEventListener('click', () => {
  if (!engine || document.body.dataset.state !== 'ready') return;
  void engine.forget().then(() => {
    showRecall();
    setStatus('Recall store emptied: nothing written before drafts any more.');
  }, showError);
});
// Another mode needs another engine (same source: a URL's data files are not downloaded again);
// another reply length, a new chat on the same engine.
ui.mode.addEventListener('change', () => {
  const current = source;
  if (current && engine) void open(() => current);
});
ui.maxNewTokens.addEventListener('change', () => {
  if (engine && document.body.dataset.state === 'ready') {
    newChat();
    setStatus(`New chat, replies up to ${chat?.maxNewTokens} tokens.`);
  }
});

// ---------------------------------------------------------------------------------------------------
// ?artifact=<url>

setState('idle');
try {
  applyParams();
  const artifact = params.get('artifact');
  if (artifact) void open(() => new UrlSource(artifact, progressReporter()));
} catch (error) {
  showError(error);
}
