/**
 * Medusa candidate trees (runtime/medusa_tree.py): choice lists → the parents list the decoder takes.
 * A choice (r0, r1, ...) takes head 0's rank-r0 token, then head 1's rank-r1 token after it. Node 0
 * is the root; node i > 0 is choice i - 1, listed after its prefix, so pruning is taking a prefix.
 */

import { SHARED } from './shared';

export type Choice = readonly number[];

/** A useful tree keeps this share of the full tree's expected extra tokens per step (the lower bound's tree). */
export const USEFUL_GAIN = SHARED.useful_gain;

const key = (choice: Choice): string => choice.join(',');

export class MedusaTree {
  readonly choices: readonly Choice[];

  constructor(choices: readonly Choice[]) {
    const seen = new Set<string>();
    for (const choice of choices) {
      if (choice.length === 0 || Math.min(...choice) < 0) throw new RangeError(`choice [${choice.join(',')}] must be a non-empty list of ranks >= 0`);
      if (seen.has(key(choice))) throw new RangeError(`choice [${choice.join(',')}] is listed twice`);
      if (choice.length > 1 && !seen.has(key(choice.slice(0, -1)))) {
        throw new RangeError(`choice [${choice.join(',')}] comes before its parent: list parents first`);
      }
      seen.add(key(choice));
    }
    this.choices = choices;
  }

  get size(): number { // T, the root included
    return this.choices.length + 1;
  }

  /** The first `size` nodes (root included). */
  prefix(size: number): MedusaTree {
    return new MedusaTree(this.choices.slice(0, Math.max(size, 1) - 1));
  }

  /** [T] parent node of each node; -1 for the root. */
  parents(): number[] {
    const index = new Map(this.choices.map((c, i) => [key(c), i + 1]));
    return [-1, ...this.choices.map((c) => index.get(key(c.slice(0, -1))) ?? 0)];
  }

  /** [T - 1] where node i > 0 takes its token in the heads' top-k table flattened to [K * k]. */
  candidateIndices(topK: number): number[] {
    if (this.choices.some((c) => c[c.length - 1] >= topK)) throw new RangeError(`a choice asks for a rank >= top_k = ${topK}`);
    return this.choices.map((c) => (c.length - 1) * topK + c[c.length - 1]);
  }
}

/** [K][k] cumulative top-1..top-k accuracy (the manifest's table) → per-rank hit chance. */
export function rankAccuracyFromCumulative(cumulative: readonly (readonly number[])[]): number[][] {
  return cumulative.map((row) => row.map((hit, rank) => hit - (rank === 0 ? 0 : row[rank - 1])));
}

/** P(every node on the path is right), heads taken as independent: the product over depth d of
 * rankAccuracy[d][choice[d]]. */
export function pathProbability(choice: Choice, rankAccuracy: readonly (readonly number[])[]): number {
  let p = 1;
  for (let depth = 0; depth < choice.length; depth++) p *= rankAccuracy[depth][choice[depth]];
  return p;
}

/** Expected tokens per verify step: 1 (the root's bonus) + the sum of path probabilities, added in node order
 * (as runtime/medusa_tree.py adds them, so both runtimes compare the same doubles). */
export function expectedAccepted(tree: MedusaTree, rankAccuracy: readonly (readonly number[])[]): number {
  let sum = 0;
  for (const choice of tree.choices) sum += pathProbability(choice, rankAccuracy);
  return 1 + sum;
}
