/**
 * The peer's page: wllama (llama.cpp compiled to WebAssembly) on a GGUF, greedy, with the DOM protocol of
 * our own page (main.ts) so one driver times both: <body data-state>, #message + #composer, #new-chat,
 * body.dataset.replyIds / replyTiming / loaded. A plain first-turn chat: each message after New chat is
 * the conversation's first.
 *
 * URL parameters: model=<url of the .gguf>, threads=N, max-new-tokens=N, ctx=N (its context, default 1024).
 * Its wasm is served by the page (vite.config.ts), nothing from a CDN. The model is fetched whole and
 * handed over as a Blob (wllama's own OPFS cache is left off: the benchmark times loading from the server).
 */
import { SHARED } from '@specmemo/engine';
import { Wllama } from '@wllama/wllama';
import wasmUrl from '@wllama/wllama/esm/wasm/wllama.wasm?url';

const params = new URLSearchParams(location.search);
const el = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const ui = {
  status: el('status'), error: el('error'), log: el('log'), form: el<HTMLFormElement>('composer'),
  message: el<HTMLTextAreaElement>('message'), send: el<HTMLButtonElement>('send'), newChat: el<HTMLButtonElement>('new-chat'),
};
const number = (name: string, fallback: number) => Number(params.get(name) ?? fallback);
const threads = self.crossOriginIsolated ? number('threads', SHARED.threads) : 1;
const maxNewTokens = number('max-new-tokens', SHARED.max_new_tokens.chat);

function setState(state: 'loading' | 'ready' | 'generating' | 'error'): void {
  document.body.dataset.state = state;
  ui.message.disabled = ui.send.disabled = ui.newChat.disabled = state !== 'ready';
}

function fail(error: unknown): void {
  ui.error.textContent = error instanceof Error ? error.message : String(error);
  ui.error.hidden = false;
  setState('error');
}

const wllama = new Wllama({ default: wasmUrl }, { suppressNativeLog: true });

async function open(): Promise<void> {
  const model = params.get('model');
  if (!model) throw new Error('?model=<url of a .gguf> is missing');
  setState('loading');
  ui.status.textContent = `Loading ${model}…`;
  const started = performance.now();
  const response = await fetch(model);
  if (!response.ok) throw new Error(`${model}: HTTP ${response.status}`);
  const blob = await response.blob();
  document.body.dataset.loaded = JSON.stringify({ network: blob.size, cache: 0 });
  await wllama.loadModel([blob], { n_threads: threads, n_ctx: number('ctx', 1024), n_gpu_layers: 0 });
  ui.status.textContent = `Ready: ${wllama.getNumThreads()} thread(s), multi-thread build ${wllama.isMultithread()}, ` +
    `loaded in ${((performance.now() - started) / 1000).toFixed(1)} s.`;
  setState('ready');
}

async function send(text: string): Promise<void> {
  if (document.body.dataset.state !== 'ready' || !text.trim()) return;
  setState('generating');
  const answer = document.createElement('div');
  answer.className = 'msg assistant';
  const body = document.createElement('div');
  body.className = 'text';
  answer.append(body);
  ui.log.append(answer);
  const sent = performance.now();
  const times: number[] = [];
  const ids: number[] = [];
  let reply = '';
  await wllama.createChatCompletion({
    messages: [{ role: 'user', content: text }], max_tokens: maxNewTokens, temperature: 0, top_k: 1,
    cache_prompt: false, return_tokens: true, stream: true,
    onData: (chunk: { choices?: { delta?: { content?: string } }[]; tokens?: number[] }) => {
      const piece = chunk.choices?.[0]?.delta?.content ?? '';
      const tokens = chunk.tokens ?? [];
      for (let i = 0; i < Math.max(1, tokens.length); i++) if (piece || tokens.length) times.push(performance.now());
      ids.push(...tokens);
      reply += piece;
      body.textContent = reply;
    },
  } as Parameters<Wllama['createChatCompletion']>[0]);
  document.body.dataset.replyIds = JSON.stringify(ids);
  document.body.dataset.replyTiming = JSON.stringify({
    tokens: times.length, ttftMs: times.length ? times[0] - sent : null,
    decodeMs: times.length > 1 ? times[times.length - 1] - times[0] : null,
  });
  setState('ready');
}

ui.form.addEventListener('submit', (event) => {
  event.preventDefault();
  const text = ui.message.value;
  ui.message.value = '';
  send(text).catch(fail);
});
ui.newChat.addEventListener('click', () => ui.log.replaceChildren());
open().catch(fail);
