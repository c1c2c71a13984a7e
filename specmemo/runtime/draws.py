"""The random numbers sampling takes, the same in both engines (android_demo/engine/src/draws.ts): one uniform draw per
position of a reply, and the token a draw picks from a distribution.

`uniform(seed, n)` is the (n+1)-th `nextDouble()` of Java's `new SplittableRandom(seed)`: SplitMix64 on the
counter seed + (n+1)*gamma (mod 2^64), its top 53 bits over 2^53. It is counter-based: the draw at a position depends
on the seed and the position alone, never on how many draws came before it, so a reply's sampled tokens do not depend
on the trees that drafted them (runtime/sampling.py). Python's integers and TypeScript's BigInt compute it exactly;
the JDK is a third implementation to test both against.

`pick(probs, u)` is the inverse of the distribution's CDF at u: the first token (in id order) whose cumulative
probability, summed in float64 from token 0 up, exceeds u times the total.
"""

from __future__ import annotations

import numpy as np

from specmemo.runtime.shared import SHARED

_SHARED = SHARED["draws"]
GAMMA: int = int(_SHARED["gamma"], 16)  # the golden ratio's 64-bit fraction: the counter's step
MULTIPLIERS: tuple[int, ...] = tuple(int(m, 16) for m in _SHARED["mix"])  # SplitMix64's two multipliers
SHIFTS: tuple[int, ...] = tuple(_SHARED["shifts"])  # its three xor-shifts
BITS: int = _SHARED["bits"]  # a double's mantissa
MASK = (1 << 64) - 1


def splitmix64(seed: int, n: int) -> int:
    """The (n+1)-th 64-bit output of SplitMix64 started at `seed` (Java's SplittableRandom.nextLong, unsigned)."""
    z = (seed + (n + 1) * GAMMA) & MASK
    z = ((z ^ (z >> SHIFTS[0])) * MULTIPLIERS[0]) & MASK
    z = ((z ^ (z >> SHIFTS[1])) * MULTIPLIERS[1]) & MASK
    return z ^ (z >> SHIFTS[2])


def uniform(seed: int, n: int) -> float:
    """The draw at position n of a reply sampled with `seed`: in [0, 1), a multiple of 2^-53."""
    return (splitmix64(seed, n) >> (64 - BITS)) / float(1 << BITS)


def pick(probs: np.ndarray, u: float) -> int:
    """The token the draw u picks from `probs` ([V], float64, summing to about 1): the CDF's inverse in id order."""
    cdf = np.cumsum(probs)  # sequential in id order, as the TypeScript loop sums
    token = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    if token >= probs.size or probs[token] <= 0:  # u·total rounded onto the total: the last token with any mass
        token = int(np.flatnonzero(probs > 0)[-1])
    return token
