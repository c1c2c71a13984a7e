/**
 * The controller (runtime/controller.py): each step, whether to draft, and how much of the draft
 * to verify. Verifying a draft's first T nodes gains 1 + sum of p_i tokens (p_i: node i's score
 * corrected per score band by what was measured) and costs draft ms + verify ms(T), the latter from
 * a T → ms curve measured once per engine. It verifies the prefix with the most tokens per ms, never
 * more nodes than KV positions left, and decodes plainly while drafting does not pay (probing now
 * and then so the statistics can recover). The same rule and constants as the Python controller.
 */

import { OrtBackend } from './backend';
import { ConfigError } from './errors';
import { ScoreCalibration } from './drafters/scoreCalibration';
import { DraftTree } from './drafters/draft';
import { WidthPolicy, prefill, verifyAndCommit } from './decode';
import { chain } from './tree';
import { SHARED } from './shared';

export const EXPLORE_EVERY = SHARED.controller.explore_every;
export const EXPLORE_MAX = SHARED.controller.explore_max;
export const FREE_DRAFT = SHARED.controller.free_draft;
export const RATE_MEMORY = SHARED.controller.rate_memory;
export const DECISION_LOG = SHARED.controller.decision_log; // decisions kept for inspection (the newest): a chat keeps one controller for all its turns
// As the Python runtime's (runtime/controller.py): a short measurement at first use, wider trees extrapolate.
export const CURVE_SIZES = SHARED.controller.curve_sizes;
export const CURVE_CONTEXT = SHARED.controller.curve_context;

export class LatencyCurve {
  constructor(readonly sizes: readonly number[], readonly stepMs: readonly number[]) {
    if (sizes.length === 0 || sizes[0] !== 1 || sizes.some((s, i) => i > 0 && s < sizes[i - 1])) {
      throw new ConfigError('a latency curve needs ascending tree sizes starting at 1');
    }
    if (sizes.length !== stepMs.length) throw new ConfigError('a latency curve needs one time per tree size');
  }

  /** ms for a verify step of T nodes, linear between measured sizes (flat beyond the ends), as np.interp. */
  step(size: number): number {
    const s = this.sizes;
    if (size <= s[0]) return this.stepMs[0];
    for (let i = 1; i < s.length; i++) {
      if (size <= s[i]) return this.stepMs[i - 1] + ((size - s[i - 1]) / (s[i] - s[i - 1])) * (this.stepMs[i] - this.stepMs[i - 1]);
    }
    return this.stepMs[s.length - 1];
  }
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
};

/** ms per verify step (forward, accept, commit) for each T in CURVE_SIZES up to `maxSize`, on a
 * `context`-token past each step rewinds to; interleaved rounds, median of round medians. */
export async function measureLatency(backend: OrtBackend, maxSize: number, context = CURVE_CONTEXT, rounds = 2, steps = 3): Promise<LatencyCurve> {
  let sizes = CURVE_SIZES.filter((s) => s <= Math.min(maxSize, backend.capacity - 2));
  if (sizes.length === 0) sizes = [1];
  backend.reset();
  const prompt = new Array<number>(Math.max(1, Math.min(context, backend.capacity - sizes[sizes.length - 1] - 1))).fill(1);
  const { root } = await prefill(backend, prompt);
  const base = backend.length;
  const perSize = new Map<number, number[]>(sizes.map((s) => [s, []]));
  for (let round = 0; round < rounds; round++) {
    for (const size of sizes) {
      const times: number[] = [];
      for (let i = 0; i < steps; i++) {
        const started = performance.now();
        await verifyAndCommit(backend, new Array<number>(size).fill(root), chain(size));
        times.push(performance.now() - started);
        backend.rewind(base);
      }
      perSize.get(size)!.push(median(times.slice(1)));
    }
  }
  backend.reset();
  return new LatencyCurve(sizes, sizes.map((s) => median(perSize.get(s)!)));
}

export interface Decision {
  drafted: number;
  size: number;
  accepted: number;
  spaceLeft: number;
  expected: number;
}

export class Controller implements WidthPolicy {
  readonly calibration = new ScoreCalibration();
  readonly decisions: Decision[] = []; // the newest DECISION_LOG
  steps = 0; // decisions made
  draftMs: number | null = null;
  draftedRate: number | null = null;
  private space = 0;
  private expected = 1;
  private exploreGap = EXPLORE_EVERY;
  private nextExplore = EXPLORE_EVERY;
  private readonly verifyMs: number[];

  constructor(readonly curve: LatencyCurve, readonly maxSize: number) {
    if (maxSize < 1) throw new ConfigError(`the controller needs T_max >= 1, got ${maxSize}`);
    this.verifyMs = Array.from({ length: maxSize }, (_, i) => curve.step(i + 1));
  }

  get plainRate(): number {
    return 1 / this.verifyMs[0];
  }

  budget(spaceLeft: number): number {
    this.space = spaceLeft;
    const limit = Math.max(1, Math.min(this.maxSize, spaceLeft));
    if (limit === 1 || this.draftedRate === null || this.draftedRate > this.plainRate) return limit;
    if (this.draftMs !== null && this.draftMs < FREE_DRAFT * this.verifyMs[0]) return limit;
    if (this.steps + 1 >= this.nextExplore) { // probe: keep the statistics alive
      this.exploreGap = Math.min(2 * this.exploreGap, EXPLORE_MAX);
      this.nextExplore = this.steps + 1 + this.exploreGap;
      return limit;
    }
    return 1;
  }

  choose(draft: DraftTree, draftMs: number): number {
    if (draftMs > 0) this.draftMs = this.draftMs === null ? draftMs : this.draftMs + (draftMs - this.draftMs) / RATE_MEMORY;
    const size = Math.min(draft.size, this.maxSize);
    if (size === 1 && draftMs === 0) {
      this.expected = 1;
      return 1;
    }
    let gain = 0;
    let best = 0;
    let bestRate = -Infinity;
    let bestGain = 1;
    for (let t = 0; t < size; t++) {
      gain += t === 0 ? 1 : this.calibration.chance(draft.scores[t]);
      const rate = gain / (draftMs + this.verifyMs[t]);
      if (rate > bestRate) { best = t; bestRate = rate; bestGain = gain; }
    }
    this.draftedRate = this.draftedRate === null ? bestRate : this.draftedRate + (bestRate - this.draftedRate) / RATE_MEMORY;
    if (this.draftedRate > this.plainRate) this.exploreGap = EXPLORE_EVERY;
    this.expected = bestGain;
    return best + 1;
  }

  observe(draft: DraftTree, size: number, path: readonly number[]): void {
    this.decisions.push({ drafted: draft.size, size, accepted: path.length, spaceLeft: this.space, expected: this.expected });
    if (this.decisions.length > DECISION_LOG) this.decisions.shift();
    this.steps += 1;
    for (let i = 1; i < size; i++) this.calibration.observe(draft.scores[i], path.includes(i));
  }
}
