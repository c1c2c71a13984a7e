/**
 * The memory model (runtime/memory.py): what a generation holds, in bytes, as arithmetic, and its lower bound
 * (runtime/plan.py lower_bound). The formulas are the Python runtime's, term for term, so both price the same
 * manifest, sizes and calibration at the same number of bytes (tests/test_lower_bound_ts.py checks it).
 *
 *   total       = load + generation + headroom
 *   load        = the calibration's load_bytes: what the process holds once the graphs are open (measured)
 *   generation  = arena + activations + step overhead
 *     arena         exact: the Python runtime's layout (arena.ts views, with the Medusa heads' I/O whenever the
 *                   manifest has heads and the feature drafter's KV whenever it has one), one allocation
 *     activations   ORT's largest live set in one layer for R rows attending to up to C rows:
 *                   R·(3·I + (H + 2·H_kv)·D + 2·h)·bytes + H·R·C·bytes
 *     step overhead the calibration's step_overhead_bytes (measured)
 *   headroom    = HEADROOM of generation, kept free for the model's own error
 *
 *   lower bound = the footprint that decodes speculatively with a useful tree over `context` tokens:
 *                 T_max = R = usefulTreeSize (sizes.ts), C = max(context, T_max + 1)
 *
 * One sequence per call (B = 1) and no sliding-window layers: parseManifest refuses those models.
 */

import { ArenaLayout, allocationBytes, kvBytes, layoutFor } from './arena';
import { ConfigError } from './errors';
import { Manifest, ModelDims, bytesPerActivation, bytesPerKvElement, scratchSlots } from './manifest';
import { DEFAULT_PREFILL_CHUNK, Sizes, exportedTree, makeSizes, usefulTreeSize } from './sizes';
import { SHARED } from './shared';

export const HEADROOM = SHARED.memory_headroom; // of predicted generation memory: room for the model's error

/**
 * What arithmetic cannot know, measured once per artifact and machine (runtime/memory.py Calibration, whose
 * load_bytes, step_overhead_bytes and base_bytes these are). A runtime without a measurement says what it
 * stands in for each term where it builds one.
 */
export interface Calibration {
  readonly loadBytes: number; // RSS after the decoder and heads sessions are open
  readonly stepOverheadBytes: number; // generation memory beyond the arena + activations formula, first steps
  readonly baseBytes?: number; // RSS before anything was opened (0 when absent)
}

/** The price of a set of sizes (runtime/memory.py Footprint, its properties as fields). */
export interface Footprint {
  readonly weightsStored: number; // the artifact's weight files (reference: `load` holds them as ORT does)
  readonly load: number;
  readonly kv: number;
  readonly io: number; // the arena besides KV: ids, positions, bias, logits, hidden states, heads I/O, alignment
  readonly activations: number;
  readonly stepOverhead: number;
  readonly sizes: Sizes; // C, R, T_max priced
  readonly bytesPerKvElement: number;
  readonly arena: number; // kv + io
  readonly generation: number; // arena + activations + step overhead
  readonly headroom: number; // HEADROOM of generation, whole bytes
  readonly total: number; // load + generation + headroom
}

/** ORT's largest live set in one layer for `rows` rows attending to up to `capacity` rows (one sequence). */
export function activationBytes(d: ModelDims, rows: number, capacity: number, itemsize: number,
  attention: 'gqa' | 'grouped' = 'gqa', kvItemsize: number = itemsize): number {
  const perRow = 3 * d.intermediate_size + (d.num_heads + 2 * d.num_kv_heads) * d.head_dim + 2 * d.hidden_size;
  return rows * perRow * itemsize + attentionBytes(d, rows, capacity, itemsize, attention, kvItemsize);
}

/** One layer's attention (runtime/memory.py attention_bytes): GQA's scores, or the grouped attention's scores,
 * their softmax and the K/V span it reads (and the float16 slices before their cast). */
export function attentionBytes(d: ModelDims, rows: number, capacity: number, itemsize: number,
  attention: 'gqa' | 'grouped', kvItemsize: number): number {
  const scores = d.num_heads * rows * capacity * itemsize;
  if (attention === 'gqa') return scores;
  const span = 2 * d.num_kv_heads * capacity * d.head_dim;
  return 2 * scores + span * itemsize + (kvItemsize !== itemsize ? span * kvItemsize : 0);
}

/** The arena the Python runtime allocates for `sizes` (arena.py ArenaLayout.for_manifest): the heads' I/O when
 * the manifest has heads, the feature drafter's KV (C + its scratch rows) when it has one. */
export function pricedLayout(m: Manifest, sizes: Sizes): ArenaLayout {
  const drafter = m.feature_drafter;
  return { ...layoutFor(m, sizes, m.heads !== null), drafterCapacity: drafter ? sizes.capacity + scratchSlots(drafter) : 0 };
}

/** The memory model's price of `sizes`; `weights`: the artifact's weight files, shown beside `load`. */
export function footprint(m: Manifest, calibration: Calibration, sizes: Sizes, { weights = 0 }: { weights?: number } = {}): Footprint {
  if (m.dims.sliding_window) {
    throw new ConfigError(`${m.source_model} has sliding-window layers: this memory model has no window layout; use the Python runtime (specmemo plan)`);
  }
  const layout = pricedLayout(m, sizes);
  const kv = kvBytes(layout);
  const io = allocationBytes(layout) - kv;
  const activations = activationBytes(m.dims, sizes.rows, sizes.capacity, bytesPerActivation(m), m.attention ?? 'gqa',
    bytesPerKvElement(m));
  const generation = kv + io + activations + calibration.stepOverheadBytes;
  const headroom = Math.floor(HEADROOM * generation);
  return {
    weightsStored: weights, load: calibration.loadBytes, kv, io, activations, stepOverhead: calibration.stepOverheadBytes,
    sizes, bytesPerKvElement: bytesPerKvElement(m), arena: kv + io, generation, headroom,
    total: calibration.loadBytes + generation + headroom,
  };
}

/** The smallest footprint that decodes speculatively with a useful tree over `context` tokens (plan.py
 * lower_bound): T_max = R = the useful tree, C = max(context, T_max + 1). A budget below its total fits no plan. */
export function lowerBound(m: Manifest, calibration: Calibration, { context }: { context: number }): Footprint {
  const tree = usefulTreeSize(m);
  return footprint(m, calibration, makeSizes(Math.max(context, tree + 1), tree, tree));
}

/** The largest C up to the graph's max capacity whose footprint at R = `rows`, T_max = `tree` fits `budget` (plan.py
 * largest_capacity, step for step: the footprint is linear in C, so two prices give the line, and alignment can add
 * a few bytes beyond it). 2 when none does. */
export function largestCapacity(m: Manifest, calibration: Calibration, budget: number,
  { rows, tree }: { rows: number; tree: number }): number {
  const total = (capacity: number): number => footprint(m, calibration, makeSizes(capacity, rows, tree)).total;
  const atTwo = total(2);
  const perPosition = total(3) - atTwo;
  let capacity = Math.min(m.max_capacity, 2 + Math.floor((budget - atTwo) / Math.max(perPosition, 1)));
  while (capacity > 2 && total(capacity) > budget) capacity -= 1;
  return capacity;
}

/** The plan for a budget (runtime/plan.py fit, step for step): the drafters' tree (`tree`, default the exported Medusa
 * tree) and the prefill chunk if they fit, cut down otherwise; then C = `context` (or, with none given, the largest C
 * up to the graph's max capacity). A budget below the lower bound for that context is refused in one line naming
 * the bound. */
export function fit(m: Manifest, calibration: Calibration, { budget, context, prefillChunk = DEFAULT_PREFILL_CHUNK, tree }: {
  budget: number; context?: number; prefillChunk?: number; tree?: number;
}): Footprint {
  const need = context ?? m.max_capacity;
  const bound = lowerBound(m, calibration, { context: need });
  const mib = (bytes: number): string => (bytes / 2 ** 20).toFixed(2);
  if (budget < bound.total) {
    throw new ConfigError(`budget ${mib(budget)} MiB is below the lower bound of ${mib(bound.total)} MiB for a ${need}-token ` +
      `context (load ${(bound.load / 2 ** 20).toFixed(1)} MiB + generation ${(bound.generation / 2 ** 20).toFixed(1)} MiB + ` +
      `headroom ${(bound.headroom / 2 ** 20).toFixed(1)} MiB): raise the budget, or lower the context`);
  }
  const fullTree = tree ?? exportedTree(m).size;
  const low = Math.min(fullTree, bound.sizes.tree);
  for (let t = fullTree; t >= low; t--) {
    const chunkRows = Math.max(t, Math.min(prefillChunk, m.max_capacity));
    for (const rows of [chunkRows, t]) {
      if (footprint(m, calibration, makeSizes(need, rows, t)).total <= budget) {
        const capacity = context ?? largestCapacity(m, calibration, budget, { rows, tree: t });
        return footprint(m, calibration, makeSizes(capacity, rows, t));
      }
    }
  }
  return bound;
}
