/**
 * Draft scores → acceptance chances, learned from what was accepted (runtime/drafters/score_calibration.py).
 *
 * The controller keeps one over the nodes it verifies; a merged drafter (draft.ts Merged) keeps one per
 * part and rescores each part's tree with it before merging, so a part whose drafts keep failing sinks
 * below the others. A part learns from the text decoded after its draft (`trials`): node d of a branch
 * was right if its path's d tokens are the d tokens that followed the draft's root; deeper nodes are
 * undecided and not counted.
 */

import { DraftTree, ordered } from './draft';
import { SHARED } from '../shared';

export const PRIOR_TRIALS = SHARED.score_calibration.prior_trials;
export const SCORE_BANDS = SHARED.score_calibration.bands;

/** Raw draft score → chance of acceptance, per band: accepted / verified, with the band's middle as a prior. */
export class ScoreCalibration {
  private readonly hits: number[];
  private readonly trials: number[];
  private readonly inner = SCORE_BANDS.slice(1, -1);

  constructor(priorTrials = PRIOR_TRIALS) {
    this.hits = SCORE_BANDS.slice(0, -1).map((edge, i) => ((edge + SCORE_BANDS[i + 1]) / 2) * priorTrials);
    this.trials = this.hits.map(() => priorTrials);
  }

  band(score: number): number { // np.searchsorted(inner, score, side="right")
    let n = 0;
    while (n < this.inner.length && this.inner[n] <= score) n++;
    return n;
  }

  chance(score: number): number {
    const b = this.band(score);
    return this.hits[b] / this.trials[b];
  }

  observe(score: number, accepted: boolean): void {
    const b = this.band(score);
    this.trials[b] += 1;
    this.hits[b] += accepted ? 1 : 0;
  }
}

/** The non-root nodes of `draft` that `followed` (the tokens decoded after its root) decides: [scores, right]. */
export function trials(draft: DraftTree, followed: readonly number[]): [number[], boolean[]] {
  const depth = [0];
  const right = [true];
  const scores: number[] = [];
  const hits: boolean[] = [];
  for (let i = 1; i < draft.size; i++) {
    const parent = draft.parents[i];
    depth.push(depth[parent] + 1);
    if (depth[i] > followed.length) {
      right.push(false); // undecided, and so are its children
      continue;
    }
    right.push(right[parent] && draft.tokens[i] === followed[depth[i] - 1]);
    scores.push(draft.scores[i]);
    hits.push(right[i]);
  }
  return [scores, hits];
}

/** `draft` with each node's score replaced by its calibrated chance, capped down each path, best first. */
export function rescored(draft: DraftTree, calibration: ScoreCalibration): DraftTree {
  if (draft.size === 1) return draft;
  return ordered(draft.tokens, draft.parents, [1, ...draft.scores.slice(1).map((s) => calibration.chance(s))], draft.size);
}
