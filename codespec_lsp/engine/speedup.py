"""The speedup model of speculative decoding: pure arithmetic, no torch, no I/O.

    E(K)       = (1 - α^(K+1)) / (1 - α)        expected tokens per target forward (K+1 at α = 1)
    speedup(K) = E(K) / (verify(K) + K·c)       c = draft cost / target cost per forward

It lives in the engine because adaptive K applies it to measured numbers at every step; the planner
(planning/planner.py) applies the same functions to numbers estimated from configs, so the two never
disagree about which K pays.
"""

from __future__ import annotations

K_MAX = 8  # the engine never proposes more than this many tokens per step


def expected_tokens(alpha: float, k: int) -> float:
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: int, c: float) -> float:
    return expected_tokens(alpha, k) / (1.0 + k * c)


def best_k(alpha: float, c: float, k_max: int = K_MAX,
           verify_cost: list[float] | None = None) -> tuple[int, float]:
    """argmax over K in 0..k_max of the speedup; ties go to the smaller K (less wasted draft work).

    verify_cost[k]: a target forward over k+1 tokens, in 1-token forwards (verify_cost[0] == 1).
    None: 1 for every k (memory-bound decoding, the plan's model); the engine passes measured ones.
    """
    best = (0, 1.0)
    for k in range(1, k_max + 1):
        verify = verify_cost[k] if verify_cost is not None else 1.0
        s = expected_tokens(alpha, k) / (verify + k * c)
        if s > best[1] + 1e-12:
            best = (k, s)
    return best
