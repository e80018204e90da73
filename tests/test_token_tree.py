"""Greedy steps verify every source's chain in one forward under a tree mask (speculative.py):
the tree's rows compute what chains would, the accepted branch's KV is what a plain decode
leaves, and the output stays the target's own."""

from __future__ import annotations

import pytest
import torch

from codespec_lsp.engine import hf
from codespec_lsp.engine.drafters import Proposal, Sampling
from codespec_lsp.engine.kvcache import KV
from codespec_lsp.engine.models import TINY_DIR, load_model
from codespec_lsp.engine.speculative import step, token_tree

PROMPT = list(range(40, 100)) + [7, 300, 12, 5, 81, 9]


@pytest.fixture(scope="module")
def target():
    return load_model(str(TINY_DIR / "target"), device="cpu", dtype=torch.float32)


class Scripted:
    """A drafter that proposes a fixed chain; it records what it was asked."""

    forwards = 0

    def __init__(self, name: str, chain: list[int]) -> None:
        self.name, self.chain, self.asked = name, chain, 0

    def propose(self, tokens, k, sampling=None, cancel=None) -> Proposal:
        self.asked += 1
        return Proposal(self.chain[:k], None)

    def rollback(self, n: int) -> None:
        pass


def greedy(target, ids: list[int], n: int) -> list[int]:
    kv, out = KV(target), []
    logits = kv.extend(ids)
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = kv.extend(out[-1:])
    return out


def test_chains_merge_where_they_start_alike_and_the_room_cuts_the_last():
    tokens, parents, paths = token_tree([[5, 6, 7], [5, 6, 9, 2], [8]], room=8)
    assert tokens == [5, 6, 7, 9, 2, 8]
    assert parents == [-1, 0, 1, 1, 3, -1]
    assert paths == [[0, 1, 2], [0, 1, 3, 4], [5]]
    tokens, parents, paths = token_tree([[5, 6, 7], [5, 9, 2]], room=4)
    assert tokens == [5, 6, 7, 9] and paths == [[0, 1, 2], [0, 3]]  # 2 did not fit


def test_a_tree_forward_gives_each_branch_the_logits_and_states_of_its_chain(target):
    pending, a, b = [17], [600, 700, 800], [600, 900, 1000]
    nodes, parents, _ = token_tree([a, b], room=8)  # 600 shared: nodes 600 700 800 900 1000
    tree = KV(target, keep_states=True)
    tree.extend(PROMPT)
    logits = tree.extend(pending + nodes, parents=parents)
    for chain, rows in ((a, [0, 1, 2, 3]), (b, [0, 1, 4, 5])):
        alone = KV(target, keep_states=True)
        alone.extend(PROMPT)
        torch.testing.assert_close(logits[rows], alone.extend(pending + chain), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(tree.hidden[len(PROMPT) + torch.tensor(rows)],
                                   alone.hidden[len(PROMPT):], rtol=1e-4, atol=1e-4)


def test_keep_moves_the_accepted_branch_down_as_if_decoded_alone(target):
    pending, a, b = [17], [600, 700], [600, 900, 1000]
    nodes, parents, paths = token_tree([a, b], room=8)
    kv = KV(target, keep_states=True)
    kv.extend(PROMPT)
    kv.extend(pending + nodes, parents=parents)
    start = len(PROMPT) + 1
    kv.keep(start, [start + node for node in paths[1]])  # branch b: rows 0, 2, 3 of the tree
    assert kv.ids == PROMPT + pending + b
    plain = KV(target, keep_states=True)
    plain.extend(PROMPT + pending + b)
    torch.testing.assert_close(kv.hidden, plain.hidden, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kv.extend([3, 4]), plain.extend([3, 4]), rtol=1e-4, atol=1e-4)


def test_the_longest_kept_branch_wins_and_the_output_is_the_targets(target):
    truth = greedy(target, PROMPT, 5)
    wrong = [t + 1 for t in truth]
    cases = [([wrong[:3], truth[:3]], 1, 3),            # second source right: its branch wins
             ([truth[:1] + wrong[1:3], truth[:4]], 1, 4),  # alike at first, the second goes further
             ([truth[:3], wrong[:2]], 0, 3)]            # first right: a chain, cropped as before
    for chains, winner, kept in cases:
        kv = KV(target)
        kv.extend(PROMPT[:-1])
        sources = [Scripted("ngram", chains[0]), Scripted("eagle", chains[1])]
        out = step(kv, list(PROMPT), [(s, 4) for s in sources], None, target.config.vocab_size)
        assert out.winner == winner and out.kept == kept
        assert out.tokens == truth[:kept + 1]
        assert [b.kept for b in out.branches][winner] == kept
        assert kv.ids == PROMPT + truth[:kept]
        assert greedy(target, PROMPT + out.tokens, 3) == greedy(target, PROMPT, kept + 4)[kept + 1:]
        # the KV left behind computes what a fresh one does
        fresh = KV(target)
        fresh.extend(PROMPT + truth[:kept])
        torch.testing.assert_close(kv.extend(out.tokens[-1:]), fresh.extend(out.tokens[-1:]),
                                   rtol=1e-4, atol=1e-4)


def test_sampling_and_eager_attention_verify_one_chain(target):
    truth = greedy(target, PROMPT, 3)
    first, second = Scripted("ngram", [truth[0] + 1]), Scripted("eagle", truth[:2])
    kv = KV(target)
    kv.extend(PROMPT[:-1])
    out = step(kv, list(PROMPT), [(first, 2), (second, 2)], Sampling(1.0, 1.0, torch.Generator().manual_seed(0)),
               target.config.vocab_size)
    assert len(out.branches) == 1 and second.asked == 0  # one chain: the rejection rule is for one
    assert hf.takes_trees(target)
    target.set_attn_implementation("eager")
    try:
        assert not hf.takes_trees(target)
        kv = KV(target)
        kv.extend(PROMPT[:-1])
        out = step(kv, list(PROMPT), [(first, 2), (second, 2)], None, target.config.vocab_size)
        assert [b.source for b in out.branches] == [first] and out.tokens == truth[:1]
    finally:
        target.set_attn_implementation("sdpa")
        hf.use_cpu_attention(target)
