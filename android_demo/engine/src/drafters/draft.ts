/**
 * What every drafter returns and reads (runtime/drafters/draft.py): a scored token tree.
 *
 * Node 0 is the root (the token the base model already chose); each other node guesses the token
 * after its parent and carries a score, the drafter's chance that it ends on the accepted path.
 * Scores never grow down a path and nodes are listed best first, so every prefix is a valid tree
 * and the most valuable one of its size.
 */

export class DraftTree {
  constructor(
    readonly tokens: readonly number[], // [T] node 0 is the root
    readonly parents: readonly number[], // [T] parents[0] = -1
    readonly scores: readonly number[], // [T] scores[0] = 1
  ) {
    if (!(tokens.length === parents.length && parents.length === scores.length) || tokens.length === 0) {
      throw new RangeError('a draft needs one token, parent and score per node, and a root');
    }
    if (parents[0] !== -1 || parents.some((p, i) => i > 0 && !(p >= 0 && p < i))) {
      throw new RangeError(`draft parents [${parents.join(', ')}]: one root first, parents before children`);
    }
  }

  static rootOnly(root: number): DraftTree {
    return new DraftTree([root], [-1], [1]);
  }

  /** Decided tokens as a chain (each certain). */
  static chain(tokens: readonly number[]): DraftTree {
    return new DraftTree(tokens, tokens.map((_, i) => i - 1), tokens.map(() => 1));
  }

  get size(): number {
    return this.tokens.length;
  }

  /** This chain with `tree` hung under its last node (which is `tree`'s root): decided tokens, then a draft of what
   * follows them. */
  graft(tree: DraftTree): DraftTree {
    const last = this.size - 1;
    if (this.parents.some((p, i) => p !== i - 1) || this.tokens[last] !== tree.tokens[0]) {
      throw new RangeError("a draft is grafted under a chain whose last token is the draft's root");
    }
    return new DraftTree([...this.tokens, ...tree.tokens.slice(1)], [...this.parents, ...tree.parents.slice(1).map((p) => p + last)],
      [...this.scores, ...tree.scores.slice(1)]);
  }

  /** The first `size` nodes (at least the root). */
  prefix(size: number): DraftTree {
    const n = Math.max(1, size);
    if (n >= this.size) return this;
    return new DraftTree(this.tokens.slice(0, n), this.parents.slice(0, n), this.scores.slice(0, n));
  }

  /** The tree of these nodes (the root and, with each node, its parent), in their order here. */
  keep(nodes: readonly number[]): DraftTree {
    const index = new Map(nodes.map((old, i) => [old, i]));
    return new DraftTree(nodes.map((i) => this.tokens[i]), nodes.map((i) => (i === 0 ? -1 : index.get(this.parents[i])!)),
      nodes.map((i) => this.scores[i]));
  }

  /** The chain root → its best child → ... (for graphs where only a chain verifies exactly). */
  bestPath(): DraftTree {
    const nodes = [0];
    for (let at = 0; ;) {
      let child = -1;
      for (let i = at + 1; i < this.size; i++) if (this.parents[i] === at) { child = i; break; } // best first
      if (child < 0) break;
      nodes.push(child);
      at = child;
    }
    return new DraftTree(nodes.map((i) => this.tokens[i]), nodes.map((_, i) => i - 1), nodes.map((i) => this.scores[i]));
  }
}

/** What a drafter may read when it drafts a step. */
export interface DraftContext {
  tokens: number[]; // every decided token of the conversation, ending with the root
  hidden: Float32Array; // [h] final hidden state of the last committed position
  rows?: Float32Array; // [T·h] the last decoder call's hidden states (arena views: read by the feature drafter)
  path?: readonly number[]; // the nodes it committed (absent: every row, as after the prompt)
  ahead?: number; // decided tokens before the root not yet run by the model (a grammar's forced chain): no hidden state
}

export interface Drafter {
  readonly name: string;
  propose(context: DraftContext, budget: number): Promise<DraftTree>; // at most `budget` nodes
}

/** Any parents-first tree → a DraftTree: scores capped by their parent's, sorted best first (stable), cut to `budget`. */
export function ordered(tokens: readonly number[], parents: readonly number[], scores: readonly number[], budget: number): DraftTree {
  const capped = [...scores];
  capped[0] = 1;
  for (let i = 1; i < capped.length; i++) capped[i] = Math.min(capped[i], capped[parents[i]]);
  const order = capped.map((_, i) => i).sort((a, b) => capped[b] - capped[a] || a - b).slice(0, Math.max(1, budget));
  const newIndex = new Map(order.map((old, i) => [old, i]));
  return new DraftTree(order.map((i) => tokens[i]), order.map((i) => (parents[i] < 0 ? -1 : newIndex.get(parents[i])!)),
    order.map((i) => capped[i]));
}

/** The union of two drafts over one root as a token trie (runtime/drafters/draft.py merge), ordered and cut. */
export function merge(first: DraftTree, second: DraftTree, budget: number): DraftTree {
  if (first.tokens[0] !== second.tokens[0]) throw new RangeError('drafts to merge must share their root');
  const tokens = [...first.tokens];
  const parents = [...first.parents];
  const scores = [...first.scores];
  const child = new Map<string, number>();
  parents.forEach((p, i) => { if (p >= 0) child.set(`${p},${tokens[i]}`, i); });
  const where = new Array<number>(second.size).fill(0);
  for (let i = 1; i < second.size; i++) {
    const parent = where[second.parents[i]];
    const k = `${parent},${second.tokens[i]}`;
    let node = child.get(k);
    if (node === undefined) {
      node = tokens.length;
      tokens.push(second.tokens[i]);
      parents.push(parent);
      scores.push(second.scores[i]);
      child.set(k, node);
    } else {
      scores[node] = Math.max(scores[node], second.scores[i]);
    }
    where[i] = node;
  }
  return ordered(tokens, parents, scores, budget);
}
