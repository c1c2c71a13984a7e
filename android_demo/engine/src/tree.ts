/**
 * Token trees as the decoder graph sees them (runtime/tree.py): parents → depths, attention bias, paths.
 *
 * A tree of T nodes is its `parents` list: parents[i] is node i's parent, or -1 for a root (a node
 * that follows the last committed token). Nodes are listed parents first, so every prefix is itself
 * a valid tree. Node i attends to the committed past, itself and its ancestors, at position
 * past + depth(i). Prefill is the chain [-1, 0, 1, ...].
 */

export function checkParents(parents: readonly number[]): void {
  parents.forEach((parent, i) => {
    if (!(parent >= -1 && parent < i)) {
      throw new RangeError(`node ${i} has parent ${parent}: parents must come before their children`);
    }
  });
}

/** [T] depth of each node; roots have depth 0. */
export function depths(parents: readonly number[]): number[] {
  checkParents(parents);
  const out: number[] = [];
  parents.forEach((parent, i) => { out[i] = parent < 0 ? 0 : out[parent] + 1; });
  return out;
}

/** [T, T] row-major: 0 where node i may attend node j (itself or an ancestor), -Infinity elsewhere. */
export function treeBias(parents: readonly number[]): Float32Array {
  checkParents(parents);
  const size = parents.length;
  const bias = new Float32Array(size * size).fill(-Infinity);
  parents.forEach((parent, i) => {
    if (parent >= 0) bias.copyWithin(i * size, parent * size, parent * size + size);
    bias[i * size + i] = 0;
  });
  return bias;
}

/** The parents of a causal chunk of `length` tokens. */
export function chain(length: number): number[] {
  return Array.from({ length }, (_, i) => i - 1);
}

/** Node indices from the root down to `node`, inclusive. */
export function pathTo(parents: readonly number[], node: number): number[] {
  const path: number[] = [];
  for (let at = node; at >= 0; at = parents[at]) path.push(at);
  return path.reverse();
}
