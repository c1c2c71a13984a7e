/**
 * Sampling, as the Python runtime samples (runtime/sampling.py): the next-token distribution after a tree node in
 * Hugging Face's order (the repetition penalty over every token before it, the context and the node's own
 * root-to-node path; then the temperature, top-k, top-p), float64 throughout, and the two acceptance rules:
 *
 *   exact (default) – a drafted child is kept when it is the token its position's seeded draw picks (draws.ts);
 *       the first node whose draw picks no child ends the step and that draw is the next root. Each token is an
 *       exact draw from the distribution, and with a seed the reply is plain sampling's, drafted or not;
 *   typical – Medusa's typical acceptance: a drafted token is kept when p gives it more than
 *       min(ε, α·exp(-entropy)); the next root is drawn after the last kept node (not draws from p).
 *
 * Sums run in id order, one term after another, as Python's do, so both engines pick the same tokens.
 */

import { ConfigError } from './errors';
import { pick, uniform } from './draws';
import { SHARED } from './shared';
import { depths } from './tree';

export const DEFAULTS = SHARED.sampling.defaults; // for an artifact whose model sets none (the manifest records them)
export const OFF = SHARED.sampling.off; // each filter's value that leaves the distribution be
export const TYPICAL = SHARED.sampling.typical; // typical acceptance's ε and α

export type Acceptance = 'exact' | 'typical';

/** How a reply samples; temperature > 0 (temperature 0 is greedy: no Sampling). */
export interface Sampling {
  temperature: number;
  topP: number;
  topK: number;
  repetitionPenalty: number;
  seed: number;
  acceptance: Acceptance;
}

/** The sampling settings an artifact's manifest records (`generation`), its model's or SpecMemo's. */
export interface GenerationDefaults {
  temperature: number;
  top_p: number;
  top_k: number;
  repetition_penalty: number;
  source?: string;
}

export interface SamplingRequest {
  temperature?: number;
  topP?: number;
  topK?: number;
  repetitionPenalty?: number;
  seed?: number;
  acceptance?: Acceptance;
}

/**
 * How a request samples (null: greedy), runtime/sampling.py's sampling_for: each setting the request gives wins,
 * then the artifact's generation defaults, then off; a temperature of 0, given or the artifact's, is exact greedy.
 */
export function samplingFor(defaults: GenerationDefaults | null | undefined, request: SamplingRequest = {}): Sampling | null {
  const temperature = request.temperature ?? defaults?.temperature ?? 0;
  if (temperature <= 0) return null;
  const sampling: Sampling = {
    temperature,
    topP: request.topP ?? defaults?.top_p ?? OFF.top_p,
    topK: request.topK ?? defaults?.top_k ?? OFF.top_k,
    repetitionPenalty: request.repetitionPenalty ?? defaults?.repetition_penalty ?? OFF.repetition_penalty,
    seed: request.seed ?? 0,
    acceptance: request.acceptance ?? 'exact',
  };
  checkSampling(sampling);
  return sampling;
}

/** Python's Sampling.__post_init__: each setting in its range, or a one-line error naming it. */
export function checkSampling(s: Sampling): void {
  if (!(s.temperature > 0)) throw new ConfigError('sampling needs temperature > 0 (temperature 0 is greedy: pass no sampling)');
  if (!(s.topP > 0 && s.topP <= 1)) throw new ConfigError(`top-p must be in (0, 1], got ${s.topP}`);
  if (!(Number.isInteger(s.topK) && s.topK >= 0)) throw new ConfigError(`top-k must be an integer >= 0 (0: off), got ${s.topK}`);
  if (!(s.repetitionPenalty > 0)) throw new ConfigError(`repetition penalty must be > 0 (1: off), got ${s.repetitionPenalty}`);
  if (!Number.isInteger(s.seed)) throw new ConfigError(`the seed must be an integer, got ${s.seed}`);
  if (s.acceptance !== 'exact' && s.acceptance !== 'typical') throw new ConfigError(`acceptance ${JSON.stringify(s.acceptance)}: use exact or typical`);
}

/** One line for a header: what the replies are drawn with (Python's describe). */
export function describe(s: Sampling | null): string {
  if (s === null) return 'greedy';
  return `sampling: temperature ${s.temperature}, top-p ${s.topP}, top-k ${s.topK}, repetition penalty ${s.repetitionPenalty}, ${s.acceptance} acceptance, seed ${s.seed}`;
}

/** The k-th largest value (quickselect on a copy: linear, where a sort of the vocabulary is not). */
export function largest(values: Float64Array, k: number): number {
  const a = Float64Array.from(values);
  const target = a.length - k; // its index in ascending order
  let lo = 0;
  let hi = a.length - 1;
  while (lo < hi) {
    const pivot = a[(lo + hi) >> 1];
    let i = lo;
    let j = hi;
    while (i <= j) {
      while (a[i] < pivot) i++;
      while (a[j] > pivot) j--;
      if (i <= j) {
        const t = a[i]; a[i] = a[j]; a[j] = t;
        i++; j--;
      }
    }
    if (target <= j) hi = j;
    else if (target >= i) lo = i;
    else return a[target];
  }
  return a[target];
}

function sum(values: Float64Array): number {
  let total = 0;
  for (let i = 0; i < values.length; i++) total += values[i];
  return total;
}

/** A row of logits and the tokens before it (`seen`, for the penalty) → its probabilities, float64. */
export function distribution(logits: ArrayLike<number>, s: Sampling, seen: Iterable<number> | null): Float64Array {
  const z = Float64Array.from(logits);
  if (s.repetitionPenalty !== 1 && seen !== null) {
    for (const t of seen) z[t] = z[t] < 0 ? z[t] * s.repetitionPenalty : z[t] / s.repetitionPenalty;
  }
  for (let i = 0; i < z.length; i++) z[i] /= s.temperature;
  if (s.topK > 0 && s.topK < z.length) {
    const kth = largest(z, s.topK);
    for (let i = 0; i < z.length; i++) if (z[i] < kth) z[i] = -Infinity;
  }
  let max = -Infinity;
  for (let i = 0; i < z.length; i++) if (z[i] > max) max = z[i];
  for (let i = 0; i < z.length; i++) z[i] = Math.exp(z[i] - max);
  let total = sum(z);
  for (let i = 0; i < z.length; i++) z[i] /= total;
  if (s.topP < 1) {
    const order: number[] = [];
    for (let i = 0; i < z.length; i++) if (z[i] > 0) order.push(i);
    order.sort((a, b) => z[b] - z[a] || a - b); // most likely first, ties by id (Python's stable argsort)
    let mass = 0;
    let cut = order.length;
    for (let j = 0; j < order.length; j++) {
      mass += z[order[j]];
      if (mass >= s.topP) { cut = j + 1; break; } // the smallest head whose mass reaches p
    }
    for (let j = cut; j < order.length; j++) z[order[j]] = 0;
    total = sum(z);
    for (let i = 0; i < z.length; i++) z[i] /= total;
  }
  return z;
}

/** The tokens a node's distribution penalises: the context's and its own path's below the root (node 0, already in
 * the context). */
function seenAt(tokens: readonly number[], parents: readonly number[], context: readonly number[], node: number, s: Sampling): Set<number> | null {
  if (s.repetitionPenalty === 1) return null;
  const seen = new Set(context);
  for (let i = node; i > 0; i = parents[i]) seen.add(tokens[i]);
  return seen;
}

/** The distribution after node `node` of a verified tree (`logits`: [N·V], its rows in node order). */
export function nodeDistribution(tokens: readonly number[], parents: readonly number[], logits: Float32Array, vocab: number,
  s: Sampling, context: readonly number[], node: number): Float64Array {
  return distribution(logits.subarray(node * vocab, (node + 1) * vocab), s, seenAt(tokens, parents, context, node, s));
}

/**
 * The step's accepted path and next root by `s.acceptance`. `position`: the reply position of the token after
 * node 0 (a node at depth d is followed by position + d); `context`: every token before the tree's root, the root
 * included.
 */
export function acceptSampled(tokens: readonly number[], parents: readonly number[], logits: Float32Array, vocab: number,
  s: Sampling, position: number, context: readonly number[]): [number[], number] {
  return s.acceptance === 'typical'
    ? acceptTypical(tokens, parents, logits, vocab, s, position, context)
    : acceptExact(tokens, parents, logits, vocab, s, position, context);
}

/** Down the tree while a child is the token its position's draw picks: (accepted path, next root). */
export function acceptExact(tokens: readonly number[], parents: readonly number[], logits: Float32Array, vocab: number,
  s: Sampling, position: number, context: readonly number[]): [number[], number] {
  const path = [0];
  for (;;) {
    const node = path[path.length - 1];
    const p = nodeDistribution(tokens, parents, logits, vocab, s, context, node);
    const want = pick(p, uniform(s.seed, position + path.length - 1));
    const child = parents.findIndex((parent, i) => parent === node && tokens[i] === want);
    if (child < 0) return [path, want];
    path.push(child);
  }
}

/** Typical acceptance over a verified tree: (accepted path, next root drawn after its last node). */
export function acceptTypical(tokens: readonly number[], parents: readonly number[], logits: Float32Array, vocab: number,
  s: Sampling, position: number, context: readonly number[]): [number[], number] {
  const depth = depths(parents);
  const probs = new Map<number, Float64Array>();
  const at = (node: number): Float64Array => {
    let p = probs.get(node);
    if (p === undefined) probs.set(node, p = nodeDistribution(tokens, parents, logits, vocab, s, context, node));
    return p;
  };
  const ok = tokens.map(() => true);
  for (let i = 1; i < tokens.length; i++) { // parents first: a node needs an accepted parent
    const parent = parents[i];
    if (parent < 0 || !ok[parent]) { ok[i] = false; continue; }
    const p = at(parent);
    let entropy = 0;
    for (let t = 0; t < p.length; t++) entropy -= p[t] * Math.log(p[t] + 1e-12);
    ok[i] = p[tokens[i]] > Math.min(TYPICAL.threshold, TYPICAL.alpha * Math.exp(-entropy));
  }
  let last = 0;
  for (let i = 1; i < tokens.length; i++) if (ok[i] && depth[i] > depth[last]) last = i; // deepest, then first
  const path: number[] = [];
  for (let i = last; i >= 0; i = parents[i]) path.unshift(i);
  return [path, pick(at(last), uniform(s.seed, position + depth[last]))];
}

/** The token at reply position `position` after `context`: its draw from the distribution after the context. */
export function sampleNext(logits: ArrayLike<number>, s: Sampling, position: number, context: readonly number[]): number {
  return pick(distribution(logits, s, s.repetitionPenalty !== 1 ? new Set(context) : null), uniform(s.seed, position));
}
