/**
 * The random numbers sampling takes, the same as the Python runtime's (runtime/draws.py): one uniform draw per
 * position of a reply, and the token a draw picks from a distribution.
 *
 * `uniform(seed, n)` is the (n+1)-th `nextDouble()` of Java's `new SplittableRandom(seed)`: SplitMix64 on the
 * counter seed + (n+1)*gamma (mod 2^64), its top 53 bits over 2^53, computed exactly in BigInt. The draw at a
 * position depends on the seed and the position alone, so a reply's sampled tokens do not depend on the trees that
 * drafted them. `pick(probs, u)` is the CDF's inverse: the first token (in id order) whose cumulative probability,
 * summed in float64 from token 0 up, exceeds u times the total.
 */

import { SHARED } from './shared';

export const GAMMA = BigInt(SHARED.draws.gamma); // the golden ratio's 64-bit fraction: the counter's step
export const MULTIPLIERS = SHARED.draws.mix.map((m: string) => BigInt(m)); // SplitMix64's multipliers
export const SHIFTS = SHARED.draws.shifts.map((s: number) => BigInt(s)); // its xor-shifts
export const BITS = SHARED.draws.bits; // a double's mantissa

/** The (n+1)-th 64-bit output of SplitMix64 started at `seed` (Java's SplittableRandom.nextLong, unsigned). */
export function splitmix64(seed: number | bigint, n: number): bigint {
  let z = BigInt.asUintN(64, BigInt(seed) + BigInt(n + 1) * GAMMA);
  z = BigInt.asUintN(64, (z ^ (z >> SHIFTS[0])) * MULTIPLIERS[0]);
  z = BigInt.asUintN(64, (z ^ (z >> SHIFTS[1])) * MULTIPLIERS[1]);
  return z ^ (z >> SHIFTS[2]);
}

/** The draw at position n of a reply sampled with `seed`: in [0, 1), a multiple of 2^-53. */
export function uniform(seed: number | bigint, n: number): number {
  return Number(splitmix64(seed, n) >> BigInt(64 - BITS)) / 2 ** BITS;
}

/** The token the draw u picks from `probs` (float64, summing to about 1): the CDF's inverse in id order. */
export function pick(probs: Float64Array, u: number): number {
  let total = 0;
  for (let i = 0; i < probs.length; i++) total += probs[i];
  const target = u * total;
  let cumulative = 0;
  let last = -1;
  for (let i = 0; i < probs.length; i++) {
    if (probs[i] <= 0) continue;
    cumulative += probs[i];
    last = i;
    if (cumulative > target) return i;
  }
  return last; // u·total rounded onto the total: the last token with any mass
}
