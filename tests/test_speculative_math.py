"""The accept/reject rule and the K model, on plain tensors (no model)."""

import pytest
import torch

from codespec_lsp.engine.adaptive import VerifyTimes
from codespec_lsp.engine.engine import KController
from codespec_lsp.engine.speculative import adjust_probs, verify_greedy, verify_sampled
from codespec_lsp.engine.speedup import best_k, expected_tokens


def test_verify_greedy_keeps_longest_agreeing_prefix_and_adds_target_token():
    logits = torch.full((4, 10), -5.0)
    for row, tok in enumerate([3, 7, 2, 9]):  # target's argmax after each prefix
        logits[row, tok] = 5.0
    assert verify_greedy(logits, [3, 7, 1]) == (2, 2)   # third draft wrong: target's 2 instead
    assert verify_greedy(logits, [3, 7, 2]) == (3, 9)   # all kept: bonus token from the last row
    assert verify_greedy(logits, [4, 7, 2]) == (0, 3)   # first wrong: nothing kept after it
    assert verify_greedy(logits[:1], []) == (0, 3)      # K = 0 is the plain target step


def _first_token_distribution(p, q, trials, rule):
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(p.size(-1))
    for _ in range(trials):
        x = int(torch.multinomial(q[0], 1, generator=gen))   # the draft really samples from q
        n, nxt = rule(p, q, [x], gen)
        counts[x if n == 1 else nxt] += 1
    return counts / trials


def test_rejection_sampling_follows_the_target_distribution():
    p = torch.tensor([[0.05, 0.40, 0.05, 0.30, 0.15, 0.05], [1 / 6] * 6])
    q = torch.tensor([[0.40, 0.05, 0.30, 0.05, 0.10, 0.10]])
    got = _first_token_distribution(p, q, 20000, verify_sampled)
    tv = 0.5 * float((got - p[0]).abs().sum())
    assert tv < 0.015, (got, p[0])

    # The bound has power: resampling from p instead of norm(max(0, p - q)) on rejection gives
    # min(p, q) + (1 - sum(min(p, q))) * p, whose distance from p is far above the bound.
    wrong = torch.minimum(p[0], q[0]) + (1 - torch.minimum(p[0], q[0]).sum()) * p[0]
    assert 0.5 * float((wrong - p[0]).abs().sum()) > 0.1


def test_one_hot_draft_uses_the_residual_without_the_proposed_token():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
    gen = torch.Generator().manual_seed(1)
    for _ in range(200):
        n, nxt = verify_sampled(p, None, [0], gen)
        assert n == 1 or nxt != 0  # rejecting token 0 can never emit token 0


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = adjust_probs(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), temperature=1.0, top_p=0.75)
    assert torch.allclose(probs, torch.tensor([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]))


def test_expected_tokens_and_best_k():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert abs(expected_tokens(0.8, 3) - (1 - 0.8 ** 4) / 0.2) < 1e-12
    flat = [1.0] * 9
    assert best_k(0.9, 0.01, 8, flat)[0] == 8       # nearly free, nearly always right: draft a lot
    assert best_k(0.3, 0.6, 8, flat)[0] == 0        # expensive and wrong: target alone
    k = best_k(0.7, 0.2, 8, flat)[0]
    rate = lambda k: expected_tokens(0.7, k) / (1 + 0.2 * k)  # noqa: E731
    assert all(rate(k) >= rate(j) for j in range(9))
    assert best_k(0.7, 0.2, 8, flat) == best_k(0.7, 0.2, 8)  # one best_k (engine.speedup, the planner's too), flat by default
    # a verify forward that grows with its length (compute-bound CPU) makes long drafts lose
    steep = [1.0 + 0.5 * n for n in range(9)]
    assert best_k(0.7, 0.2, 8, steep)[0] < k


def test_controller_learns_acceptance_and_goes_to_zero_when_drafting_does_not_pay():
    ctl = KController(prior_alpha=0.6, prior_cost=0.3)
    for _ in range(30):
        ctl.record(proposed=4, kept=0, seconds=0.004)
    assert ctl.alpha < 0.05
    ks = [ctl.choose(target_s=0.01, verify_cost=[1.0] * 9) for _ in range(16)]
    assert ks.count(0) == 15 and ks[-1] == 1  # K = 0, with one probe so a recovery is noticed
    for _ in range(30):  # 120 positions kept: the estimate follows (it weighs about 30)
        ctl.record(proposed=4, kept=4, seconds=0.0001)
    assert ctl.alpha > 0.9 and ctl.choose(target_s=0.01, verify_cost=[1.0] * 9) >= 6


def test_controller_falls_to_zero_when_drafting_steps_are_slower_than_the_target():
    """The model may say draft (high acceptance) while the realised steps lose (a verify over
    several tokens costing more than measured): the realised rate decides."""
    ctl = KController(prior_alpha=0.9, prior_cost=0.05)
    flat = [1.0] * 9
    assert ctl.choose(target_s=0.01, verify_cost=flat) > 0
    for _ in range(8):  # every draft kept, but each 5-token step took 100 ms: 50 tokens/s < 100
        ctl.record(proposed=4, kept=4, seconds=0.001, tokens=5, step_s=0.1)
    assert ctl.alpha > 0.9 and ctl.choose(target_s=0.01, verify_cost=flat) == 0


def test_failed_probes_back_off():
    ctl = KController(prior_alpha=0.0, prior_cost=0.5)
    flat = [1.0] * 9
    gaps, since = [], 0
    for _ in range(16 + 32 + 64 + 1):
        k = ctl.choose(target_s=0.01, verify_cost=flat)
        since += 1
        if k:
            ctl.record(proposed=1, kept=0, seconds=0.005, tokens=1, step_s=0.02)
            gaps.append(since)
            since = 0
    assert gaps == [16, 32, 64]  # each failed probe doubles the wait: probes cost ever less


def test_sampling_under_token_healing_follows_the_targets_constrained_distribution():
    """What `step` does with `heal`: the target's logits are masked, then the usual rejection rule
    runs, so a draft that mostly proposes tokens the constraint forbids is rejected, and the
    first token follows the target's distribution renormalised over the allowed tokens."""
    from codespec_lsp.completion.heal import Heal, HealVocab
    texts = ["", " a", " b", "x", " ", "y"]        # id 0 special; heal " " allows 1, 2 and 4
    heal = Heal(HealVocab(texts), " ")
    logits = torch.log(torch.tensor([[0.05, 0.10, 0.05, 0.40, 0.20, 0.20], [1 / 6] * 6]))
    q = torch.tensor([[0.0, 0.10, 0.10, 0.40, 0.10, 0.30]])
    gen = torch.Generator().manual_seed(0)
    trials, counts = 20000, torch.zeros(6)
    for _ in range(trials):
        x = int(torch.multinomial(q[0], 1, generator=gen))
        p = adjust_probs(heal.mask(logits, [x]), 1.0, 1.0)
        n, nxt = verify_sampled(p, q, [x], gen)
        counts[x if n == 1 else nxt] += 1
    want = torch.tensor([0.0, 0.10, 0.05, 0.0, 0.20, 0.0]) / 0.35
    got = counts / trials
    assert counts[[0, 3, 5]].sum() == 0                     # nothing the constraint forbids
    assert 0.5 * float((got - want).abs().sum()) < 0.015, (got, want)


def test_rejection_draws_use_the_generators_device(monkeypatch):
    """Issue 28, bug 3: the engine makes the generator on the target's device, and the draws were
    asked for on the CPU, which a CUDA generator refuses. Checked without a GPU: a stand-in
    generator on "cuda" and a torch.rand that records where it was asked to draw."""
    import types

    from codespec_lsp.engine import speculative
    asked = []
    real_rand = torch.rand

    def rand(*size, generator=None, device=None):
        asked.append((torch.device(device), generator))
        return real_rand(*size)

    monkeypatch.setattr(speculative.torch, "rand", rand)
    cuda_generator = types.SimpleNamespace(device=torch.device("cuda"))
    u = speculative.uniform(3, cuda_generator, torch.device("cpu"))
    assert asked == [(torch.device("cuda"), cuda_generator)] and u.device == torch.device("cpu")
    asked.clear()
    speculative.uniform(2, None, torch.device("cpu"))
    assert asked == [(torch.device("cpu"), None)]
    asked.clear()
    p = torch.softmax(torch.randn(3, 5), -1)
    monkeypatch.setattr(speculative, "sample", lambda probs, generator=None: 0)
    speculative.verify_sampled(p, None, [1, 2], generator=cuda_generator)
    assert asked and asked[0][0] == torch.device("cuda")


def test_a_step_with_nothing_proposed_is_no_drafting_step():
    """Issue 26, bug 3: a step whose n-gram lookup found nothing ran the target alone (one token
    per forward, a little slower for the lookup); counted as a drafting step, eight of them made
    the free drafter look slower than the target and set its K to 0."""
    ctl = KController(prior_alpha=0.5, prior_cost=0.01)
    costs = [1.0 + 0.05 * k for k in range(9)]
    for _ in range(8):
        ctl.record(0, 0, 0.0001, tokens=1, step_s=0.011)
    assert ctl.choose(0.010, costs) > 0 and not ctl.steps and ctl.alpha == 0.5
    for _ in range(8):  # real drafting steps that lose to the target still switch it off
        ctl.record(2, 0, 0.0001, tokens=1, step_s=0.012)
    assert ctl.choose(0.010, costs) == 0


def test_a_source_switched_off_by_its_steps_comes_back_after_a_kept_probe():
    """Issue 26: a K = 1 source keeping 43 % of its drafts pays (1.43 tokens a step for about 1.1
    forwards), but a run of rejections reads slower than the target and switches it off. The
    window kept those steps, so a kept probe every 16 steps left the source off; now the window is
    emptied when it is switched off, and a kept probe switches it back on."""
    ctl = KController(prior_alpha=0.45, prior_cost=0.1)
    flat = [1.0] * 9
    for _ in range(8):  # an unlucky run: every draft rejected, one token a 11 ms step
        ctl.record(proposed=1, kept=0, seconds=0.001, tokens=1, step_s=0.011)
    ks = [ctl.choose(target_s=0.010, verify_cost=flat) for _ in range(16)]
    assert ks.count(0) == 15 and ks[-1] == 1 and ctl.off  # off, then one probe
    ctl.record(proposed=1, kept=1, seconds=0.001, tokens=2, step_s=0.011)
    assert not ctl.off and ctl.choose(target_s=0.010, verify_cost=flat) == 1
    # and a source whose steps keep losing is switched off again
    for _ in range(8):
        ctl.record(proposed=1, kept=0, seconds=0.001, tokens=1, step_s=0.011)
    assert ctl.choose(target_s=0.010, verify_cost=flat) == 0 and ctl.off


def test_a_k1_source_keeping_under_half_its_drafts_still_pays():
    """The realised rate reads the mean tokens a step: at 3 kept drafts of 8 the median step
    yields one token, which read as slower than the target although 1.375 tokens a step for
    1.1 forwards beats it."""
    ctl = KController(prior_alpha=0.4, prior_cost=0.1)
    for kept in (1, 0, 0, 1, 0, 1, 0, 0):
        ctl.record(proposed=1, kept=kept, seconds=0.001, tokens=1 + kept, step_s=0.011)
    assert ctl.pays(0.010) and ctl.choose(target_s=0.010, verify_cost=[1.0] * 9) >= 1


def test_one_slow_forward_does_not_set_the_verify_cost_of_every_longer_k():
    """Issue 26: verify_cost never decreases, so a single 3-token forward slowed by another
    process (2.4x a 1-token one) made every K >= 2 look unaffordable for the rest of a run."""
    times = VerifyTimes()
    for _ in range(8):
        times.record(1, 0.010)
        times.record(2, 0.011)
    times.record(3, 0.024)
    costs = times.costs()
    assert costs[1] == pytest.approx(1.1) and costs[2] == pytest.approx(1.1)  # unmeasured: assumed
    for seconds in (0.013, 0.030, 0.013, 0.014):  # measured now; the slow ones are outvoted
        times.record(3, seconds)
    costs = times.costs()
    assert costs[2] == pytest.approx(1.3) and costs[3] == pytest.approx(1.3)  # not 2.4, nor 3.0


def test_a_verify_length_measured_dear_is_measured_again_later():
    """Adaptive K stops feeding a length that looked dear, so its times would never be renewed: a
    burst of load would set K's ceiling for good. Old times are forgotten (STALE forwards)."""
    from codespec_lsp.engine import adaptive
    times = VerifyTimes()
    for _ in range(4):
        times.record(3, 0.050)  # measured under load: 5x a 1-token forward
    for _ in range(8):
        times.record(1, 0.010)
    assert times.costs()[2] == pytest.approx(5.0)
    for _ in range(adaptive.STALE):  # K stays under 2 all this while: no new 3-token forward
        times.record(1, 0.010)
    assert times.costs()[2] == pytest.approx(1.1)  # assumed cheap again, so K tries it


def test_a_branch_joining_a_tree_is_planned_on_the_rows_it_adds():
    from codespec_lsp.engine.engine import marginal_costs
    costs = [1.0, 1.05, 1.38, 1.43, 1.43, 1.43, 1.49, 1.5, 1.55]
    assert marginal_costs(costs, 0) == costs  # alone: the whole forward
    after_three = marginal_costs(costs, 3)    # a chain of 3 drafted already: 4 tokens fed
    assert after_three[0] == 1.0 and after_three[1:6] == pytest.approx([1.0, 1.0, 1.06, 1.07, 1.12])
    assert after_three[6:] == [float("inf")] * 3  # past K_MAX rows in all: not draftable
    # at the head's acceptance on unseen code, alone it drafts one token; joining, several
    assert best_k(0.35, 0.03, 8, costs)[0] == 1
    assert best_k(0.35, 0.03, 8, after_three)[0] >= 2
