/**
 * C, R and T_max: the arena's free dimensions, decided once and passed down (runtime/sizes.py).
 *
 *   C      KV positions the arena holds (<= the graph's max_capacity)
 *   R      most tokens one decoder call takes: the prefill chunk, and any tree up to R nodes
 *   T_max  most tree nodes one step verifies, also N, the most logit rows a call returns
 */

import { ConfigError } from './errors';
import { DRAFTERS, DrafterName } from './drafters/names';
import { Manifest, ManifestError, RowRoute, manifestRoute } from './manifest';
import { MedusaTree, USEFUL_GAIN, expectedAccepted, rankAccuracyFromCumulative } from './medusaTree';
import { SHARED } from './shared';

export const DEFAULT_PREFILL_CHUNK = SHARED.prefill_chunk;

export interface Sizes {
  readonly capacity: number; // C
  readonly rows: number; // R
  readonly tree: number; // T_max (= N logit rows)
}

export function makeSizes(capacity: number, rows: number, tree: number): Sizes {
  if (capacity < 2 || rows < 1 || !(tree >= 1 && tree <= rows)) {
    throw new ConfigError(`need C >= 2, R >= 1 and 1 <= T_max <= R, got C=${capacity}, R=${rows}, T_max=${tree}`);
  }
  return Object.freeze({ capacity, rows, tree });
}

/** The Medusa tree the artifact was exported with (a one-node tree without heads). */
export function exportedTree(m: Manifest): MedusaTree {
  return new MedusaTree(m.heads === null ? [] : m.heads.tree);
}

/**
 * The lower bound's tree (runtime/medusa_tree.py useful_tree_size): the smallest prefix of the exported tree
 * with USEFUL_GAIN of its expected extra tokens per step, from the manifest's accuracy table; 2 nodes without
 * a table; 1 without heads.
 */
export function usefulTreeSize(m: Manifest): number {
  const medusa = exportedTree(m);
  if (medusa.size === 1) return 1;
  const accuracy = m.heads?.accuracy ?? [];
  if (accuracy.length === 0) return 2;
  const rankHit = rankAccuracyFromCumulative(accuracy);
  const full = expectedAccepted(medusa, rankHit) - 1;
  for (let size = 2; size <= medusa.size; size++) {
    if (expectedAccepted(medusa.prefix(size), rankHit) - 1 >= USEFUL_GAIN * full) return size;
  }
  return medusa.size;
}

export function checkCapacity(m: Manifest, capacity: number): number {
  if (capacity > m.max_capacity) {
    throw new ManifestError(`capacity ${capacity} exceeds the graph's max capacity ${m.max_capacity}: re-export with --max-capacity ${capacity}, or allocate less`);
  }
  return capacity;
}

/** T_max the drafters can use: the exported Medusa tree, prompt lookup's or recall's branch + the root, the feature
 * drafter's tree; 1 without drafters. */
export function draftTreeSize(m: Manifest, drafters: readonly DrafterName[]): number {
  return Math.max(1, ...drafters.map((name) => DRAFTERS.get(name)!.maxTree ?? exportedTree(m).size));
}

/**
 * The sizes an engine opens with: the manifest's device plan as written when it has one and no
 * capacity is asked for; otherwise C = `capacity` (default the graph's max), T_max = the drafters'
 * tree, R = the prefill chunk or the tree if larger (runtime/plan.py _default_sizes, without a budget).
 */
export function resolveSizes(m: Manifest, drafters: readonly DrafterName[], capacity?: number,
  prefillChunk: number = DEFAULT_PREFILL_CHUNK, route: RowRoute = manifestRoute(m)): Sizes {
  if (capacity === undefined && m.plan !== null) return makeSizes(m.plan.capacity, m.plan.rows, m.plan.tree);
  // logit rows for at least a one-token call's rows on the route (plan.make_plan): greedy's LM head runs a verify's rows
  const tree = Math.max(draftTreeSize(m, drafters), route.minRows, route.multiple);
  return makeSizes(checkCapacity(m, capacity ?? m.max_capacity), Math.max(prefillChunk, tree), tree);
}
