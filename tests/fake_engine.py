"""A deterministic stand-in for the engine (no torch) that honours its contract.

It "generates" a scripted continuation a few pieces per simulated forward pass, checks the cancel
token between forwards and yields ids through a Generation whose result keeps the counts.
A `gate` lets a test hold the engine between forwards to cancel it at a known point, without
timing assumptions.

Run as a script it serves LSP over stdio with this engine, for protocol tests that should not
pay for loading real models:  python tests/fake_engine.py
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import Callable

from codespec_lsp.engine.api import CancelToken, Generation, GenerationResult

_PIECE = re.compile(r"\w+|\s|[^\w\s]")


def default_script(prompt: str) -> str:
    """Predictable code-like continuations keyed on the end of the prompt."""
    line = prompt.rsplit("\n", 1)[-1]
    if line.endswith("long = "):  # one line far longer than any max tokens: cancel tests
        return " + ".join(f"v{i}" for i in range(300)) + "\n"
    if line.rstrip().endswith(":"):
        indent = len(line) - len(line.lstrip()) + 4
        return f"\n{' ' * indent}return value + 1\n\ndef other():\n    pass\n"
    if not line.strip():
        return "result = compute(value)\nprint(result)\n"
    return "value + 1\nnext_line()\n"


class FakeTokenizer:
    """Pieces (words, single spaces, punctuation) as ids, numbered as they are first seen."""
    bos_token_id = None
    eos_token_id = None
    all_special_ids: list[int] = []

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.index: dict[str, int] = {}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # as HF's Rust tokenizers do on a lone surrogate
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, ...]") from exc
        ids = []
        for piece in _PIECE.findall(text):
            if piece not in self.index:
                self.index[piece] = len(self.pieces)
                self.pieces.append(piece)
            ids.append(self.index[piece])
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(self.pieces[i] for i in ids)


class FakeEngine:
    kind = "local"
    preset = "fake"
    draft_name = "fake-draft"
    target_name = "fake-target"
    device = "cpu"
    supports_heal = False

    def __init__(self, script: Callable[[str], str] = default_script, *,
                 tokens_per_forward: int = 3, forward_s: float = 0.0,
                 gate: threading.Event | None = None, context_window: int = 2048,
                 fim_tokens: tuple[str, str, str] | None = None, logprob: float = 0.0) -> None:
        self.script = script
        self.logprob = logprob  # of every token; NaN plays a model with broken weights
        self.tokens_per_forward = tokens_per_forward
        self.forward_s = forward_s
        self.gate = gate
        self.context_window = context_window
        self.fim_tokens = fim_tokens
        self.tokenizer = FakeTokenizer()
        self.stop_ids: set[int] = set()
        self.reported_s_per_token: float | None = None
        self.calls = 0
        self.prompts: list[str] = []
        self.prefills: list[str] = []
        self.max_tokens_seen: list[int] = []
        self.started = threading.Event()  # set when a generate() call is in its first forward
        self._lock = threading.Lock()      # the real engine is not thread-safe: catch misuse

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def prefill(self, ids: list[int], *, key: str | None = None,
                cancel: CancelToken | None = None) -> GenerationResult:
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("FakeEngine.prefill called concurrently")
        try:
            self.prefills.append(self.tokenizer.decode(ids))
            return GenerationResult(prefill_tokens=len(ids))
        finally:
            self._lock.release()

    def count_tokens(self, text: str) -> int:
        return len(_PIECE.findall(text))

    def generate(self, ids: list[int], *, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None, cancel: CancelToken | None = None,
                 speculative: bool = True, key: str | None = None, lookup_ids=(), heal: str = "",
                 **_) -> Generation:
        res = GenerationResult()
        return Generation(self._steps(self.tokenizer.decode(ids), max_new_tokens, cancel, res), res)

    def _steps(self, prompt, max_new_tokens, cancel, res):
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("FakeEngine.generate called concurrently")
        t0 = time.perf_counter()
        try:
            self.calls += 1
            self.prompts.append(prompt)
            self.max_tokens_seen.append(max_new_tokens)
            pieces = self.tokenizer.encode(self.script(prompt))[:max_new_tokens]
            # Like the engine's prefix cache: only what differs from the previous prompt is prefilled.
            last = self.prompts[-2] if len(self.prompts) > 1 else ""
            common = len(os.path.commonprefix([last, prompt]))
            res.prefill_tokens = self.count_tokens(prompt[common:]) + 1
            res.reused_tokens = self.count_tokens(prompt[:common])
            self.started.set()
            while len(res.tokens) < len(pieces):
                if cancel is not None and cancel.cancelled:
                    res.cancelled, res.stop_reason = True, "cancelled"
                    break
                # A forward pass "runs" here: a test holding the gate holds the engine mid-forward.
                if self.gate is not None:
                    self.gate.wait(timeout=10)
                if self.forward_s:
                    time.sleep(self.forward_s)
                step = pieces[len(res.tokens):len(res.tokens) + self.tokens_per_forward]
                res.target_forwards += 1
                res.draft_forwards += len(step)
                res.proposed += len(step)
                res.accepted += len(step) - 1
                for tok in step:
                    res.tokens.append(tok)
                    res.logprobs.append(self.logprob)
                    yield tok
        finally:
            res.wall_s = time.perf_counter() - t0
            if self.reported_s_per_token is not None:  # report slower than it ran (timing tests)
                res.wall_s = self.reported_s_per_token * (len(res.tokens) + 1)
            self._lock.release()


def main() -> int:
    """Serve LSP with a FakeEngine, same flags as `codespec-lsp serve` (stdio unless --tcp/--ws);
    FAKE_FORWARD_S slows each simulated forward, FAKE_LOAD_S the load."""
    from codespec_lsp.cli import build_parser
    from codespec_lsp.lsp.server import run_server

    args = build_parser().parse_args(["serve", *sys.argv[1:]])
    forward_s = float(os.environ.get("FAKE_FORWARD_S", "0"))
    load_s = float(os.environ.get("FAKE_LOAD_S", "0"))

    def loader(settings):
        time.sleep(load_s)
        if settings.target == "broken":
            from codespec_lsp.engine.api import ModelLoadError
            raise ModelLoadError("fake: the target folder 'broken' has no weights")
        if settings.target == "nan":  # loads, but every forward gives NaN (broken weights)
            return FakeEngine(forward_s=forward_s, logprob=float("nan"))
        return FakeEngine(forward_s=forward_s)

    return run_server(args, loader=loader)


if __name__ == "__main__":
    sys.exit(main())
