"""`bench engine`'s `lossless` is measured on the path the server runs (issue 28): healing, the
name lean and the copy prior on, not a bare generate with all three off."""

from __future__ import annotations

import pytest

from codespec_lsp.bench.engine import speed
from codespec_lsp.engine.copy_prior import COPY_WEIGHT
from codespec_lsp.engine.scoring import PURE, SCORING
from engine_helpers import make_engine, tiny_parts

pytestmark = pytest.mark.slow


def test_speed_compares_both_modes_on_the_servers_path():
    tok, target, draft = tiny_parts()
    engine = make_engine(target, draft, tok)
    engine.scoring = SCORING["tiny"]  # what load_engine(preset="tiny") gives this target
    asked = []
    generate = engine.generate

    def recording(ids, **options):
        asked.append(options)
        return generate(ids, **options)

    engine.generate = recording
    prompt = "def size(self):\n    total = self.total_count\n    return total_c"
    out = speed(engine, [prompt], max_tokens=8, repeats=1)
    assert out["lossless"] is True and len(asked) == 2
    assert {o["speculative"] for o in asked} == {True, False}
    for options in asked:
        heal = options["constraint"]
        assert heal is not None and heal.words == ["total_count"]  # healed " total_c", leaning to the name
        assert options["copy_weight"] == COPY_WEIGHT


def test_speed_runs_a_model_without_measured_knobs_pure():
    """An unmeasured model (or --exact) is served without the copy prior or the lean, so the
    bench measures it that way too."""
    tok, target, draft = tiny_parts()
    engine = make_engine(target, draft, tok)
    engine.scoring = PURE
    asked = []
    generate = engine.generate

    def recording(ids, **options):
        asked.append(options)
        return generate(ids, **options)

    engine.generate = recording
    prompt = "def size(self):\n    total = self.total_count\n    return total_c"
    assert speed(engine, [prompt], max_tokens=8, repeats=1)["lossless"] is True
    for options in asked:
        assert options["constraint"].words == [] and options["copy_weight"] == 0.0
