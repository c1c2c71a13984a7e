/**
 * The numeric route probed on this device (runtime/route_probe.py, the same question): may greedy run one row a
 * call? On a grouped-attention artifact (runtime/span.py) a pseudo-random chain after a 23-token prompt is decoded
 * one token a call, then in one call of each size; where every row's logits equal the one-token calls' bit for bit,
 * the answer is one row. Anything else keeps the manifest's route (a padding row), which is exact everywhere probed.
 */

import { OrtBackend } from './backend';
import { Manifest, RowRoute, manifestRoute } from './manifest';
import type { DecoderSession } from './session';
import { chain } from './tree';
import { SHARED } from './shared';

const PROMPT = SHARED.route_probe.prompt; // no multiple of 2 or 4: the calls attend to lengths of every alignment
const SIZES = SHARED.route_probe.sizes;
const ONE_ROW: RowRoute = { minRows: 1, multiple: 1 };

/** Pseudo-random token ids (xorshift32: the same on every run and device). */
function tokens(count: number, vocab: number, seed: number): number[] {
  let x = seed >>> 0 || 1;
  return Array.from({ length: count }, () => {
    x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    return x % vocab;
  });
}

function same(a: Float32Array, b: Float32Array): boolean {
  return a.length === b.length && a.every((x, i) => Object.is(x, b[i]));
}

/** One row where it is exact on this device, else the manifest's route; the session is left empty. */
export async function probeRoute(session: DecoderSession, m: Manifest): Promise<RowRoute> {
  const fallback = manifestRoute(m);
  if (m.attention !== 'grouped') return fallback; // GroupQueryAttention's one-row calls take other kernels
  const sizes = SIZES.filter((s) => s <= Math.min(session.rows, session.logitRows));
  const longest = Math.max(0, ...sizes);
  if (sizes.length === 0 || session.kv.capacity < PROMPT + 2 * longest + 2) return fallback;
  const backend = new OrtBackend(session, ONE_ROW);
  backend.withLogits = true;
  const vocab = m.dims.vocab_size;
  const [prompt, ids] = [tokens(PROMPT, vocab, 1), tokens(longest, vocab, 2)];
  try {
    await backend.forward(prompt, chain(PROMPT), true);
    backend.commit(chain(PROMPT).map((_, i) => i));
    const base = backend.length;
    const alone: Float32Array[] = [];
    for (const id of ids) {
      alone.push((await backend.forward([id], [-1])).logits!);
      backend.commit([0]);
    }
    const v = vocab;
    for (const size of sizes) {
      backend.rewind(base);
      const together = (await backend.forward(ids.slice(0, size), chain(size))).logits!;
      for (let i = 0; i < size; i++) if (!same(together.subarray(i * v, (i + 1) * v), alone[i])) return fallback;
    }
    return ONE_ROW;
  } finally {
    backend.reset();
  }
}
