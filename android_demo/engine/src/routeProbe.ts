/**
 * The numeric route probed on this device (runtime/route_probe.py, the same question, candidates and tokens): a
 * pseudo-random chain after a 23-token prompt is decoded one token a call, then in one call of each size, under each
 * candidate route of shared.json, cheapest first; the first under which every row's logits equal the one-token calls'
 * bit for bit is this device's. Where none is, the manifest's route (exact everywhere probed) is kept. An app keeps
 * the answer (Engine.route) and hands it back on its next start (EngineOptions.route), as Python caches its probe.
 */

import { OrtBackend } from './backend';
import { splitmix64 } from './draws';
import { Manifest, RowRoute, manifestRoute } from './manifest';
import type { DecoderSession } from './session';
import { chain } from './tree';
import { SHARED } from './shared';

const PROMPT = SHARED.route_probe.prompt; // no multiple of 2 or 4: the calls attend to lengths of every alignment
const SIZES = SHARED.route_probe.sizes;
const CANDIDATES: RowRoute[] = SHARED.route_probe.candidates.map(([minRows, multiple]: number[]) => ({ minRows, multiple }));

/** Pseudo-random token ids, the same in both engines (route_probe.py probe_tokens): SplitMix64's outputs mod V. */
export function probeTokens(seed: number, count: number, vocab: number): number[] {
  return Array.from({ length: count }, (_, n) => Number(splitmix64(seed, n) % BigInt(vocab)));
}

function same(a: Float32Array, b: Float32Array): boolean {
  return a.length === b.length && a.every((x, i) => Object.is(x, b[i]));
}

/** Whether every call size's rows equal one-token calls' under `route`. */
async function exactUnder(session: DecoderSession, route: RowRoute, prompt: number[], ids: number[], sizes: number[]): Promise<boolean> {
  const backend = new OrtBackend(session, route);
  backend.withLogits = true;
  try {
    await backend.forward(prompt, chain(prompt.length), true);
    backend.commit(chain(prompt.length).map((_, i) => i));
    const base = backend.length;
    const alone: Float32Array[] = [];
    for (const id of ids) {
      alone.push((await backend.forward([id], [-1])).logits!);
      backend.commit([0]);
    }
    const v = session.layout.vocabSize;
    for (const size of sizes) {
      backend.rewind(base);
      const together = (await backend.forward(ids.slice(0, size), chain(size))).logits!;
      for (let i = 0; i < size; i++) if (!same(together.subarray(i * v, (i + 1) * v), alone[i])) return false;
    }
    return true;
  } finally {
    backend.reset();
  }
}

/** The first candidate exact on this device, else the manifest's route; the session is left empty. */
export async function probeRoute(session: DecoderSession, m: Manifest): Promise<RowRoute> {
  const fallback = manifestRoute(m);
  const sizes = SIZES.filter((s: number) => s <= Math.min(session.rows, session.logitRows));
  const longest = Math.max(0, ...sizes);
  if (sizes.length === 0 || session.kv.capacity < PROMPT + 2 * longest + 2 + Math.max(...CANDIDATES.map((c) => c.minRows))) return fallback;
  const vocab = m.dims.vocab_size;
  const prompt = probeTokens(SHARED.route_probe.prompt_seed, PROMPT, vocab);
  const ids = probeTokens(SHARED.route_probe.chain_seed, longest, vocab);
  for (const route of CANDIDATES) if (await exactUnder(session, route, prompt, ids, sizes)) return route;
  return fallback;
}
