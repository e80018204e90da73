"""Per-model scoring knobs (engine/scoring.py) and the exact mode, through complete_at: the
preset's measured values apply to its own target only; anything else, and `exact`, gets the
target's own output (no copy prior, no name lean)."""

from __future__ import annotations

import pytest

from codespec_lsp.completion import complete
from codespec_lsp.completion.complete import complete_at
from codespec_lsp.completion.context import ContextBuilder
from codespec_lsp.engine.scoring import PURE, SCORING, Scoring, scoring_for
from fake_engine import FakeEngine

SOURCE = "fixers_applied = []\nfixers_after = 1\nx = fixers_a"


class Recording(FakeEngine):
    def generate(self, ids, **k):
        self.seen.append(k)
        return super().generate(ids, **k)


@pytest.fixture(autouse=True)
def _healed(monkeypatch):
    """The half-typed `fixers_a` backed up, as token healing does with a real vocabulary (the
    fake's is not one): the name lean then has names to lean to."""
    def prompt_ids(backend, text):
        return backend.encode(text[:-len("fixers_a")]), "fixers_a"
    monkeypatch.setattr(complete, "prompt_ids", prompt_ids)

    def healing(backend, heal, words=(), word_bias=0.0):  # what complete_at asks to heal with
        backend.seen.append({"words": list(words), "word_bias": word_bias})
        return None
    monkeypatch.setattr(complete, "healing", healing)


def ask(engine, **kw) -> dict:
    engine.seen = []
    builder = ContextBuilder(engine.count_tokens, 512, fim_tokens=engine.fim_tokens)
    complete_at(engine, builder, "file:///t.py", SOURCE, len(SOURCE), max_tokens=8, **kw)
    healed, generated = engine.seen[-2:]
    return {**generated, **healed}


def test_the_models_knobs_apply_unless_exact():
    engine = Recording()
    engine.scoring = Scoring(copy_weight=0.4, word_bias=10.0)
    call = ask(engine)
    assert call["copy_weight"] == 0.4 and set(call["words"]) == {"fixers_applied", "fixers_after"}
    assert ask(engine, copy_weight=0.1)["copy_weight"] == 0.1  # the setting wins over the model
    exact = ask(engine, exact=True, copy_weight=0.9)
    assert exact["copy_weight"] == 0.0 and list(exact["words"]) == [] and exact["word_bias"] == 0.0


def test_a_backend_without_measured_knobs_runs_the_pure_target():
    engine = Recording()
    call = ask(engine)
    assert call["copy_weight"] == 0.0 and list(call["words"]) == []


def test_measured_values_belong_to_the_presets_own_target():
    assert scoring_for("tiny", own_target=True) == SCORING["tiny"] != PURE
    assert scoring_for("tiny", own_target=False) == PURE  # --target some/folder or x.gguf
    assert scoring_for("codellama-python", own_target=True) == PURE  # not measured yet
    assert scoring_for("tiny", own_target=True, exact=True) == PURE
    assert all(s.measured for s in SCORING.values())  # every stored value names its measurement
