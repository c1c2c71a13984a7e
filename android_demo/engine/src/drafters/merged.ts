/** Several drafters as one (runtime/drafters/__init__.py Merged). */

import { ScoreCalibration, rescored, trials } from './scoreCalibration';
import { DraftContext, DraftTree, Drafter, merge } from './draft';

/** Several drafters as one: each drafts within the whole budget; each tree is rescored by its own part's
 * calibration (how often that part's drafts were right, judged by the text decoded after them), then the trees
 * are merged and cut (runtime/drafters/__init__.py Merged). */
export class Merged implements Drafter {
  readonly name: string;
  readonly calibrations: ScoreCalibration[];
  private last: { tokens: number[]; root: number; drafts: DraftTree[] } | null = null;

  constructor(readonly drafters: readonly Drafter[]) {
    this.name = drafters.map((d) => d.name).join('+');
    this.calibrations = drafters.map(() => new ScoreCalibration());
  }

  /** Judge each part's last draft by what was decoded after its root (the same context list, grown). */
  private learn(tokens: number[]): void {
    const last = this.last;
    if (last === null || last.tokens !== tokens || tokens.length <= last.root + 1) return;
    const followed = tokens.slice(last.root + 1);
    last.drafts.forEach((draft, k) => {
      const [scores, right] = trials(draft, followed);
      scores.forEach((s, i) => this.calibrations[k].observe(s, right[i]));
    });
  }

  async propose(context: DraftContext, budget: number): Promise<DraftTree> {
    this.learn(context.tokens);
    const drafts: DraftTree[] = [];
    for (const drafter of this.drafters) drafts.push(await drafter.propose(context, budget));
    this.last = { tokens: context.tokens, root: context.tokens.length - 1, drafts };
    let out: DraftTree | null = null;
    drafts.forEach((draft, k) => {
      const tree = rescored(draft, this.calibrations[k]);
      out = out === null ? tree : tree.size > 1 ? merge(out, tree, budget) : out;
    });
    return out!.prefix(budget);
  }
}
