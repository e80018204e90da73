"""The speculative step: verify K drafted tokens with one target forward, over plain tensors.

Shapes: V vocabulary, K drafted tokens.
  target logits/probs p: [K+1, V]  row i scores the token after (accepted prefix + proposal[:i])
  draft probs q:         [K, V]    the distribution each proposal was drawn from
                                   (None for a deterministic drafter: q is one-hot at the proposal)
Greedy keeps the longest prefix that matches the target's argmax, then takes the target's own
next token, so the output is exactly the target's greedy output under the configured scoring: the
target's logits after token healing's mask, the name lean (heal.Heal) and the copy prior
(copy_prior.py), which `step` applies to every verify row. With the lean and the prior on (the
server's defaults) that is not the bare model's output; exact mode turns both off, and then it
is. Sampling uses the standard rejection rule (Leviathan et al. 2023; Chen et al. 2023): keep x
with probability min(1, p(x)/q(x)), else draw from norm(max(0, p - q)); the output then follows
the target's distribution under the same scoring (tempered and top-p cut after the mix) exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from codespec_lsp.engine.speedup import K_MAX, best_k  # noqa: F401  (re-exported for the engine)


def adjust_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Sampling distribution from logits [..., V]: softmax(logits / T), then the top-p cut. Draft
    and target go through the same transform, so the output follows the target's temperature/top-p
    distribution. The target's logits here are its scores after healing, the lean and the copy
    prior's mix, so those are tempered with it (copy_prior.py)."""
    probs = torch.softmax(logits / max(temperature, 1e-5), dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs > top_p   # keep the smallest set reaching top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def uniform(k: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """k draws in [0, 1) on `device`. A generator draws only on its own device (the engine makes
    it on the target's: a CUDA one given device="cpu" raises), so the draw is made there."""
    where = generator.device if generator is not None else device
    return torch.rand(k, generator=generator, device=where).to(device)


def verify_greedy(target_logits: torch.Tensor, proposal: list[int]) -> tuple[int, int]:
    """Returns (accepted count n, the target's next token after proposal[:n])."""
    k = len(proposal)
    predicted = target_logits.argmax(-1)                                        # [K+1]
    agree = (predicted[:k] == torch.tensor(proposal, dtype=torch.long, device=predicted.device)).int()
    n = int(agree.cumprod(0).sum())
    return n, int(predicted[n])


def verify_sampled(p: torch.Tensor, q: torch.Tensor | None, proposal: list[int],
                   generator: torch.Generator | None = None) -> tuple[int, int]:
    """p [K+1, V] target probs, q [K, V] draft probs (None: one-hot). Returns (n, next token)."""
    k = len(proposal)
    x = torch.tensor(proposal, dtype=torch.long, device=p.device)
    if q is None:
        q = torch.nn.functional.one_hot(x, p.size(-1)).to(p.dtype)
    rows = torch.arange(k, device=p.device)
    accept_prob = (p[rows, x] / q[rows, x]).clamp(max=1.0)                      # min(1, p(x)/q(x))
    u = uniform(k, generator, p.device)
    rejected = (u >= accept_prob).nonzero()
    if len(rejected) == 0:
        return k, sample(p[k], generator)                                       # all kept: bonus token
    n = int(rejected[0])
    residual = (p[n] - q[n]).clamp(min=0.0)                                     # max(0, p - q)
    if float(residual.sum()) <= 0.0:
        residual = p[n]  # p == q on its support: rejection had probability 0, guard rounding only
    return n, sample(residual / residual.sum(), generator)


@dataclass
class Step:
    tokens: list[int]      # the kept drafts, then the target's own token
    logprobs: list[float]  # the target's log-probability of each
    source: object         # the drafter whose proposal was verified (None: the target alone)
    proposed: int
    kept: int
    fed: int               # tokens in the verify forward (its cost depends on it)
    draft_s: float
    verify_s: float


def step(target, seq: list[int], drafts: list, sampling, vocab: int, cancel=None, heal=None,
         copy=None) -> Step:
    """One speculative step: draft K, verify them in one target forward, accept, crop both caches.

    target: a KV holding a prefix of seq (what it lacks, at most a few prompt tokens at the first
    step, is fed in the same forward as the drafts). drafts: (drafter, K) pairs, asked in
    turn until one proposes. Returns the new tokens: the longest accepted draft prefix, then one
    token from the target (its correction, or the bonus token when every draft was kept).
    heal (heal.Heal) and copy (copy_prior.CopyPrior) are part of the target's scores: drafts are
    verified against the scores they give.
    """
    t0 = time.perf_counter()
    proposal, source = None, None
    for drafter, k in drafts:                                         # draft: q, x[0..K)
        if k > 0:
            proposal, source = drafter.propose(seq, k, sampling, cancel), drafter
            if proposal.tokens:
                break
    x = proposal.tokens if proposal is not None else []               # K drafted tokens
    q = proposal.probs if proposal is not None else None              # [K, V] or None (one-hot)
    t1 = time.perf_counter()
    fed = seq[len(target):] + x
    logits = target.extend(fed)[-(len(x) + 1):, :vocab]               # [K+1, V] one forward
    constrained = heal.mask(logits, x) if heal is not None else logits
    if copy is not None:
        constrained = copy.mix(constrained, seq, x)
    if sampling is None:                                              # greedy: argmax agreement
        n, token = verify_greedy(constrained, x)
    else:                                                             # keep x_i w.p. min(1, p/q)
        p = adjust_probs(constrained, sampling.temperature, sampling.top_p)
        n, token = verify_sampled(p, q, x, sampling.generator)
    target.crop(len(seq) + n)                                         # roll back the rejected drafts
    for drafter, _ in drafts:
        drafter.rollback(len(seq) + n)
    new = x[:n] + [token]
    logp = torch.log_softmax(constrained[:n + 1].float(), dim=-1)[torch.arange(n + 1), torch.tensor(new)]
    return Step(new, logp.tolist(), source, len(x), n, len(fed), t1 - t0, time.perf_counter() - t1)
