/**
 * Recall (runtime/drafters/recall.py): draft what followed the context's last tokens the latest time
 * they were written before — an earlier turn, an earlier conversation, a file an app added — from the
 * store of what was already written (recall.ts). The longest of ORDERS that matches proposes one branch;
 * node d of a branch found by an n-gram scores hit(n, matched) ** d: HIT[n], closer to 1 when the match
 * runs back further than the longest order (a copy in progress), a prior the calibrations correct. The
 * conversation's own text comes first: where it matches at least as far back, recall proposes nothing.
 */

import { ORDERS, Recall } from '../recallStore';
import { DraftContext, DraftTree, Drafter } from './draft';
import { ConversationIndex, longer } from './lookup';
import { SHARED } from '../shared';

export const RECALL_MAX_BRANCH = SHARED.recall.max_branch;
const HIT: Record<number, number> = Object.fromEntries(ORDERS.map((n, i) => [n, SHARED.recall.hit[i]]));
const LONGEST = ORDERS[ORDERS.length - 1];

export function hit(order: number, matched: number): number {
  return matched <= LONGEST ? HIT[order] : longer(HIT[LONGEST], LONGEST, matched);
}

export class RecallDrafter implements Drafter {
  readonly name = 'recall';

  /** `conversation`: how far back the conversation's own text matches (shared with prompt lookup where the engine runs both). */
  constructor(readonly store: Recall, readonly conversation: ConversationIndex = new ConversationIndex()) {}

  propose(context: DraftContext, budget: number): Promise<DraftTree> {
    const root = context.tokens[context.tokens.length - 1];
    const own = this.conversation.update(context.tokens);
    const match = budget > 1 ? this.store.lookup(context.tokens, Math.min(budget - 1, RECALL_MAX_BRANCH)) : null;
    if (match === null || own.continuation(1)[1] >= match.matched) return Promise.resolve(DraftTree.rootOnly(root)); // its own text first
    const branch = match.continuation;
    const chance = hit(match.order, match.matched);
    return Promise.resolve(new DraftTree([root, ...branch], [-1, ...branch.map((_, i) => i)], [1, ...branch.map((_, d) => chance ** (d + 1))]));
  }
}
