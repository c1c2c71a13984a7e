/**
 * Prompt lookup (runtime/drafters/lookup.py): draft the continuation of the longest earlier match
 * of the context's last n tokens (n = MAX_NGRAM down to MIN_NGRAM) as one branch. No weights.
 * Node d of a branch whose match runs back `matched` tokens (followed past its n-gram, up to MAX_MATCH)
 * scores hit(matched) ** d, a prior the controller and the merged drafter's calibration correct.
 */

import { DraftContext, DraftTree, Drafter } from './draft';
import { SHARED } from '../shared';

export const MIN_NGRAM = SHARED.lookup.min_ngram;
export const MAX_NGRAM = SHARED.lookup.max_ngram;
export const LOOKUP_MAX_BRANCH = SHARED.lookup.max_branch;
const HIT: Record<number, number> = Object.fromEntries(SHARED.lookup.hit.map((hit, i) => [i + 1, hit]));
export const MAX_MATCH = SHARED.lookup.max_match;

/** `chance` of a match `length` tokens long, for one running back `matched` >= `length` tokens: its miss rate
 * shrinking as 1/matched (a longer match, a likelier copy). */
export function longer(chance: number, length: number, matched: number): number {
  return 1 - ((1 - chance) * length) / matched;
}

/** HIT up to MAX_NGRAM, then `longer` from there. */
export function hit(matched: number): number {
  return matched <= MAX_NGRAM ? HIT[matched] : longer(HIT[MAX_NGRAM], MAX_NGRAM, matched);
}

/** n-gram → the position after its most recent occurrence whose next token is known. */
export class NgramIndex {
  readonly tokens: number[] = [];
  private readonly after = new Map<string, number>();

  extend(tokens: readonly number[]): void {
    const seen = this.tokens;
    for (const token of tokens) {
      const end = seen.length;
      for (let n = MIN_NGRAM; n <= Math.min(MAX_NGRAM, end); n++) this.after.set(seen.slice(end - n, end).join(','), end);
      seen.push(token);
    }
  }

  /** [the tokens after the longest matching suffix's latest earlier occurrence, how many tokens back it matches
   * (its n, followed back up to MAX_MATCH)]; [[], 0] if none. */
  continuation(length: number): [number[], number] {
    const seen = this.tokens;
    const end = seen.length;
    for (let n = Math.min(MAX_NGRAM, end); n >= MIN_NGRAM; n--) {
      const start = this.after.get(seen.slice(end - n).join(','));
      if (start === undefined) continue;
      let matched = n;
      while (matched < MAX_MATCH && start - 1 - matched >= 0 && seen[start - 1 - matched] === seen[end - 1 - matched]) matched++;
      return [seen.slice(start, start + length), matched];
    }
    return [[], 0];
  }
}

/**
 * An NgramIndex kept in step with the context list a reply grows (indexed afresh for a new reply). The
 * drafters of one engine that read the conversation's n-grams (lookup, recall) share one: updating it
 * again with the same list adds nothing.
 */
export class ConversationIndex {
  index = new NgramIndex();
  private source: number[] | null = null; // the context token list the index mirrors

  update(tokens: number[]): NgramIndex {
    if (tokens !== this.source || tokens.length < this.index.tokens.length) { // a new reply: index afresh
      this.index = new NgramIndex();
      this.source = tokens;
    }
    this.index.extend(tokens.slice(this.index.tokens.length));
    return this.index;
  }
}

export class PromptLookup implements Drafter {
  readonly name = 'lookup';

  /** `conversation`: the index shared with recall where the engine runs both; its own when not given. */
  constructor(readonly conversation: ConversationIndex = new ConversationIndex()) {}

  propose(context: DraftContext, budget: number): Promise<DraftTree> {
    return Promise.resolve(this.draft(context, budget));
  }

  /** The branch after the longest earlier match (no model call: the tree is ready at once). */
  draft(context: DraftContext, budget: number): DraftTree {
    const root = context.tokens[context.tokens.length - 1];
    const [branch, matched] = this.conversation.update(context.tokens).continuation(Math.min(budget - 1, LOOKUP_MAX_BRANCH));
    if (branch.length === 0) return DraftTree.rootOnly(root);
    const chance = hit(matched);
    return new DraftTree([root, ...branch], [-1, ...branch.map((_, i) => i)], [1, ...branch.map((_, d) => chance ** (d + 1))]);
  }
}
