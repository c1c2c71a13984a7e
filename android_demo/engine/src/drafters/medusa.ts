/**
 * Medusa heads as a drafter (runtime/drafters/medusa.py): K heads read the last committed
 * position's hidden state; head k's top-k guesses fill the exported tree. A node's score is the
 * product of its path's head probabilities.
 */

import { MedusaTree } from '../medusaTree';
import { DraftContext, DraftTree, Drafter, ordered } from './draft';

export interface Heads {
  readonly topK: number; // k
  /** [h] → (ids, probs), each [K * k] flattened, best first; views valid until the next call. */
  draft(hidden: Float32Array): Promise<[BigInt64Array, Float32Array]>;
}

export class MedusaDrafter implements Drafter {
  readonly name = 'medusa';
  private readonly parents: number[];
  private readonly index: number[];

  constructor(private readonly heads: Heads, private readonly tree: MedusaTree) {
    this.parents = tree.parents();
    this.index = tree.candidateIndices(heads.topK);
  }

  async propose(context: DraftContext, budget: number): Promise<DraftTree> {
    const root = context.tokens[context.tokens.length - 1];
    // ahead: the root's hidden state is not computed yet (a grammar's forced chain runs first)
    if (budget <= 1 || this.tree.size === 1 || (context.ahead ?? 0) > 0) return DraftTree.rootOnly(root);
    const [ids, probs] = await this.heads.draft(context.hidden);
    const tokens = [root, ...this.index.map((i) => Number(ids[i]))];
    const scores = [1, ...this.index.map(() => 1)];
    for (let i = 1; i < tokens.length; i++) scores[i] = scores[this.parents[i]] * probs[this.index[i - 1]];
    return ordered(tokens, this.parents, scores, budget);
  }
}
