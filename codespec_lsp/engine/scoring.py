"""Per-model scoring knobs: what is mixed into or gates the target's output, measured per model.

A knob tuned on one model does not carry to another: the copy prior's weight picked on the 6 M
`tiny` pair (0.5) costs SmolLM2-135M about a third of the characters it gets right. So each
preset carries the values measured on it (`bench quality` on code it was not trained on; the
measurement JSON is named in `measured`), and anything not measured — the CodeLlama presets
until they are, a folder or GGUF given with --target — runs the pure target: no copy prior, no
name lean. `exact` (the `exact` setting) asks for the pure target whatever the model.
`min_confidence` is not part of the target's output (it only hides lines), so PURE keeps the
gate at its general default.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scoring:
    copy_weight: float = 0.0   # engine/copy_prior.py's share in the target's scores
    word_bias: float = 0.0     # completion/heal.py's lean of a half-typed word to the file's names
    min_confidence: float | None = None  # postprocess's gate; None: DEFAULT_MIN_CONFIDENCE
    measured: str = ""         # the measurement behind the numbers (benchmarks/results/...)

    @property
    def exact(self) -> bool:
        """True when the target's output is left as the target gives it."""
        return self.copy_weight == 0 and self.word_bias == 0


PURE = Scoring()

SCORING: dict[str, Scoring] = {
    # The values the pipeline was built around, measured on the tiny pair (copy_prior.py and
    # heal.py name the runs).
    "tiny": Scoring(copy_weight=0.5, word_bias=10.0, min_confidence=None,
                    measured="benchmarks/results/copy_weight_cpu_tiny.json, "
                             "benchmarks/results/word_bias_tuning_cpu_tiny.json"),
    # Measured on benchmarks/unseen_tune (64 points, scripts/tune_scoring.py): prefix kept /
    # similarity 10.02 / 0.668 pure, 10.12 / 0.639 at copy weight 0.25, 7.31 / 0.551 at 0.5,
    # 9.73 / 0.653 with the name lean; at line starts the pure target leads on both (10.97 /
    # 0.575 vs 10.81 / 0.560). The 0.1 prefix gain at 0.25 is within noise and costs similarity:
    # SmolLM2 runs pure. minConfidence 0 to 0.02 gave the same figures; 0.05 hides more, keeps less.
    # Checked on benchmarks/unseen_check (same JSON): copy weight 0.25 kept 5.78 characters, the
    # tiny values (0.5 + lean) 4.28; the pure target was not run on the check set yet.
    "smol": Scoring(copy_weight=0.0, word_bias=0.0, min_confidence=None,
                    measured="benchmarks/results/scoring_smol_cpu.json"),
}


def scoring_for(preset: str | None, own_target: bool, exact: bool = False) -> Scoring:
    """The knobs for `preset`'s own target; PURE for anything else or in exact mode."""
    if exact or not own_target:
        return PURE
    return SCORING.get(preset or "", PURE)
