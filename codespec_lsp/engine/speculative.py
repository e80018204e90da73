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

Greedy steps verify a token tree (SpecInfer, Miao et al. 2024; Medusa's and EAGLE-2's trees): the
chains of every source that proposed (the n-gram lookup's and the EAGLE head's disagree on the
first token at most steps where the lookup is wrong), merged where they start alike, in one
forward under a tree mask. Each branch is a chain verified as above; the longest kept one wins, so
the output is still the target's greedy output. Why (docs/draft.md, section (e)): on unseen code
the lookup's first token was wrong at two thirds of the steps it drafted, and the head's chain
would have kept about 0.3 tokens a step more; a CPU verify costs about the same for 3-8 rows.
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
class Branch:
    """One source's drafted chain in a step, and how many of its tokens the target kept."""
    source: object
    tokens: list[int]
    probs: torch.Tensor | None
    draft_s: float
    kept: int = 0


@dataclass
class Step:
    tokens: list[int]      # the kept drafts, then the target's own token
    logprobs: list[float]  # the target's log-probability of each
    branches: list[Branch]  # every chain verified (a token tree when more than one)
    winner: int | None     # the branch whose drafts were kept (None: the target alone)
    fed: int               # tokens in the verify forward (its cost depends on it)
    draft_s: float
    verify_s: float

    @property
    def kept(self) -> int:
        return self.branches[self.winner].kept if self.winner is not None else 0


def token_tree(chains: list[list[int]], room: int) -> tuple[list[int], list[int], list[list[int]]]:
    """Chains merged into a tree of at most `room` nodes: (node tokens, node parents, each chain's
    nodes). Parent -1 is the last token before the drafts; chains that start alike share those
    nodes, so only where they differ costs verify rows. A chain that meets the room limit is cut."""
    tokens: list[int] = []
    parents: list[int] = []
    paths: list[list[int]] = []
    node_of: dict[tuple[int, int], int] = {}
    for chain in chains:
        path, parent = [], -1
        for token in chain:
            node = node_of.get((parent, token))
            if node is None:
                if len(tokens) >= room:
                    break
                node = node_of[(parent, token)] = len(tokens)
                tokens.append(token)
                parents.append(parent)
            path.append(node)
            parent = node
        paths.append(path)
    return tokens, parents, paths


def _propose(drafts: list, seq: list[int], sampling, cancel, tree: bool) -> list[Branch]:
    """Ask each source with K > 0 in turn (K an int, or a function of the tree rows drafted so
    far). Greedy, with `tree`: every source that proposes gives a branch (module docstring).
    Sampling: the first that proposes, since the rejection rule that keeps the target's
    distribution is for one chain; so too for a model whose attention takes no tree mask."""
    branches = []
    for drafter, k in drafts:
        if callable(k):  # K given the rows the branches before it drafted (engine._plan)
            k = k(len(token_tree([b.tokens for b in branches], K_MAX)[0]))
        if k <= 0:
            continue
        t0 = time.perf_counter()
        proposal = drafter.propose(seq, k, sampling, cancel)
        if proposal.tokens:
            branches.append(Branch(drafter, proposal.tokens, proposal.probs, time.perf_counter() - t0))
            if sampling is not None or not tree:
                break
            branches += [Branch(drafter, [token], None, 0.0) for token in proposal.runners_up]
    return branches


def step(target, seq: list[int], drafts: list, sampling, vocab: int, cancel=None, heal=None,
         copy=None) -> Step:
    """One speculative step: draft, verify every branch in one target forward, accept, crop.

    target: a KV holding a prefix of seq (what it lacks, at most a few prompt tokens at the first
    step, is fed in the same forward as the drafts). drafts: (drafter, K) pairs (see _propose);
    one forward verifies at most K_MAX drafted tokens. Returns the new tokens: the longest
    accepted draft prefix over the branches, then one token from the target (its correction, or
    the bonus token when every draft was kept). heal (heal.Heal) and copy (copy_prior.CopyPrior)
    are part of the target's scores: each branch is verified against the scores they give it, as
    a step-by-step decode along that branch would have scored it.
    """
    t0 = time.perf_counter()
    proposed = _propose(drafts, seq, sampling, cancel, target.takes_trees)
    nodes, parents, paths = token_tree([b.tokens for b in proposed], K_MAX)
    branches = [b for b, path in zip(proposed, paths) if path]        # what the room limit left
    paths = [path for path in paths if path]
    for branch, path in zip(branches, paths):
        del branch.tokens[len(path):]
    t1 = time.perf_counter()
    pending = seq[len(target):]
    logits = target.extend(pending + nodes, parents=parents)[len(pending) - 1:, :vocab]  # one forward
    candidates = branches or [Branch(None, [], None, 0.0)]            # no drafts: the target alone
    best, outcome = 0, None
    for i, (branch, path) in enumerate(zip(candidates, paths or [[]])):
        x = branch.tokens
        rows = logits[[0] + [1 + node for node in path]]              # [K+1, V] along this branch
        scored = heal.mask(rows, x) if heal is not None else rows
        if copy is not None:
            scored = copy.mix(scored, seq, x)
        if sampling is None:                                          # greedy: argmax agreement
            n, nxt = verify_greedy(scored, x)
        else:                                                         # keep x_i w.p. min(1, p/q)
            p = adjust_probs(scored, sampling.temperature, sampling.top_p)
            n, nxt = verify_sampled(p, branch.probs, x, sampling.generator)
        branch.kept = n
        if outcome is None or n > candidates[best].kept:
            best, outcome = i, (nxt, scored)
    token, constrained = outcome
    winner = best if branches else None
    kept_nodes = paths[best][:candidates[best].kept] if branches else []
    target.keep(len(seq), [len(seq) + node for node in kept_nodes])  # drop the rejected drafts
    for drafter, _ in drafts:
        drafter.rollback(len(seq) + len(kept_nodes))
    new = [nodes[node] for node in kept_nodes] + [token]
    n = len(kept_nodes)
    logp = torch.log_softmax(constrained[:n + 1].float(), dim=-1)[torch.arange(n + 1), torch.tensor(new)]
    return Step(new, logp.tolist(), branches, winner, len(pending) + len(nodes), t1 - t0,
                time.perf_counter() - t1)
