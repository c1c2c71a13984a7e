/**
 * The page's URL parameters: artifact=<url of the artifact folder>, mode=auto|tree|plain (greedy: plain), max-new-tokens=N,
 * drafter=<e.g. medusa+lookup>, capacity=N (KV positions), threads=N, system=<system prompt>,
 * model-format=onnx|ort (the .ort graphs of an `export --mobile` artifact), budget=<MiB> (the memory the
 * page may plan into; default a share of navigator.deviceMemory: memory.ts), recall=on (draft from what was
 * written before, in earlier turns and visits: a store in IndexedDB per artifact, recallFile.ts; off by default)
 * and recall-budget=<MiB> (its size, set apart from the budget before the KV cache is fitted; default 8),
 * format=text|json (json: every reply is a JSON object, by constrained decoding with xgrammar's WebAssembly build),
 * and sampling as `specmemo chat` takes it: temperature=T (0: greedy; mode=greedy is the same), top-p=P, top-k=K,
 * repetition-penalty=R, seed=N; what is not given comes from the artifact's manifest (its model's defaults).
 * A bad value is an Error naming the parameter and what it takes.
 */
import { DEFAULT_BUDGET, SHARED, type SamplingRequest } from '@specmemo/engine';

export const params = new URLSearchParams(location.search);

/** ?<name>=N, a whole number >= 1; undefined when absent. */
export function intParam(name: string): number | undefined {
  const raw = params.get(name);
  if (raw === null || raw === '') return undefined;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1) throw new Error(`?${name}=${raw}: expected a whole number >= 1`);
  return n;
}

/** ?model-format=ort: the .ort graphs of an `export --mobile` artifact (default: the .onnx ones). */
export function modelFormat(): 'onnx' | 'ort' {
  const format = params.get('model-format') ?? 'onnx';
  if (format !== 'onnx' && format !== 'ort') throw new Error(`?model-format=${format}: use onnx or ort`);
  return format;
}

/** ?recall=on: the recall store's budget in bytes (?recall-budget=<MiB>, default the engine's); null: off. */
export function recallBudget(): number | null {
  const recall = params.get('recall') ?? 'off';
  if (recall !== 'on' && recall !== 'off') throw new Error(`?recall=${recall}: use on or off`);
  const raw = params.get('recall-budget');
  const mib = raw === null || raw === '' ? DEFAULT_BUDGET / 2 ** 20 : Number(raw);
  if (!(mib > 0)) throw new Error(`?recall-budget=${raw}: expected a size in MiB above 0, e.g. 8`);
  return recall === 'on' ? Math.floor(mib * 2 ** 20) : null;
}

/** ?format=json: replies held to a JSON object (constraint.ts); text by default. */
export function replyFormat(): 'text' | 'json' {
  const format = params.get('format') ?? 'text';
  if (format !== 'text' && format !== 'json') throw new Error(`?format=${format}: use text or json`);
  return format;
}

/** ?temperature= ... ?seed=: the page's sampling request (what is absent, the manifest's; mode=greedy: argmax). */
export function samplingParams(): SamplingRequest {
  const number = (name: string, integer = false): number | undefined => {
    const raw = params.get(name);
    if (raw === null || raw === '') return undefined;
    const n = Number(raw);
    if (!Number.isFinite(n) || (integer && !Number.isInteger(n))) throw new Error(`?${name}=${raw}: expected ${integer ? 'a whole number' : 'a number'}`);
    return n;
  };
  const greedy = params.get('mode') === SHARED.modes.argmax;
  return {
    temperature: greedy ? 0 : number('temperature'), topP: number('top-p'), topK: number('top-k', true),
    repetitionPenalty: number('repetition-penalty'), seed: number('seed', true),
  };
}
