"""A deterministic stand-in for the engine (no torch) that honours its contract.

It "generates" a scripted continuation a few pieces per simulated forward pass, checks the cancel
token between forwards, applies `stop` / `stop_fn`, and returns a GenerationResult with counts.
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

from codespec_lsp.engine.api import CancelToken, GenerationResult

_PIECE = re.compile(r"\w+|\s|[^\w\s]")


def default_script(prompt: str) -> str:
    """Predictable code-like continuations keyed on the end of the prompt."""
    line = prompt.rsplit("\n", 1)[-1]
    if line.rstrip().endswith(":"):
        indent = len(line) - len(line.lstrip()) + 4
        return f"\n{' ' * indent}return value + 1\n\ndef other():\n    pass\n"
    if not line.strip():
        return "result = compute(value)\nprint(result)\n"
    return "value + 1\nnext_line()\n"


class FakeEngine:
    preset = "fake"
    draft_name = "fake-draft"
    target_name = "fake-target"
    device = "cpu"

    def __init__(self, script: Callable[[str], str] = default_script, *,
                 tokens_per_forward: int = 3, forward_s: float = 0.0,
                 gate: threading.Event | None = None, context_window: int = 2048,
                 fim_tokens: tuple[str, str, str] | None = None) -> None:
        self.script = script
        self.tokens_per_forward = tokens_per_forward
        self.forward_s = forward_s
        self.gate = gate
        self.context_window = context_window
        self.fim_tokens = fim_tokens
        self.calls = 0
        self.prompts: list[str] = []
        self.prefills: list[str] = []
        self.max_tokens_seen: list[int] = []
        self.started = threading.Event()  # set when a generate() call is in its first forward
        self._lock = threading.Lock()      # the real engine is not thread-safe: catch misuse

    def prefill(self, prompt: str, cancel: CancelToken | None = None) -> int:
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("FakeEngine.prefill called concurrently")
        try:
            self.prefills.append(prompt)
            return self.count_tokens(prompt)
        finally:
            self._lock.release()

    def count_tokens(self, text: str) -> int:
        return len(_PIECE.findall(text))

    def generate(self, prompt: str, *, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, stop=(), stop_fn=None, cancel: CancelToken | None = None,
                 speculative: bool = True, lookup_text: str = "") -> GenerationResult:
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("FakeEngine.generate called concurrently")
        try:
            return self._generate(prompt, max_new_tokens, stop, stop_fn, cancel)
        finally:
            self._lock.release()

    def _generate(self, prompt, max_new_tokens, stop, stop_fn, cancel) -> GenerationResult:
        t0 = time.perf_counter()
        self.calls += 1
        self.prompts.append(prompt)
        self.max_tokens_seen.append(max_new_tokens)
        pieces = _PIECE.findall(self.script(prompt))[:max_new_tokens]
        # Like the engine's prefix cache: only what differs from the previous prompt is prefilled.
        last = self.prompts[-2] if len(self.prompts) > 1 else ""
        common = len(os.path.commonprefix([last, prompt]))
        res = GenerationResult(text="", tokens=[], stop_reason="max_tokens", cancelled=False,
                               prefill_tokens=self.count_tokens(prompt[common:]) + 1,
                               reused_tokens=self.count_tokens(prompt[:common]))
        out: list[str] = []
        self.started.set()
        while len(out) < len(pieces):
            if cancel is not None and cancel.cancelled:
                res.cancelled, res.stop_reason = True, "cancelled"
                break
            # A forward pass "runs" here: a test holding the gate holds the engine mid-forward.
            if self.gate is not None:
                self.gate.wait(timeout=10)
            if self.forward_s:
                time.sleep(self.forward_s)
            step = pieces[len(out):len(out) + self.tokens_per_forward]
            res.target_forwards += 1
            res.draft_forwards += len(step)
            res.proposed += len(step)
            res.accepted += len(step) - 1
            out.extend(step)
            text = "".join(out)
            cut = stop_fn(text) if stop_fn is not None else None
            for s in stop:
                if s in text:
                    cut = min(cut if cut is not None else len(text), text.index(s))
            if cut is not None:
                out = [text[:cut]]
                res.stop_reason = "stop"
                break
        res.text = "".join(out)
        res.tokens = list(range(self.count_tokens(res.text)))
        res.wall_s = time.perf_counter() - t0
        return res


def main() -> int:
    """Serve LSP with a FakeEngine, same flags as `codespec-lsp serve` (stdio unless --tcp/--ws);
    FAKE_FORWARD_S slows each simulated forward, FAKE_LOAD_S the load."""
    from codespec_lsp.cli import build_parser
    from codespec_lsp.server import run_server

    args = build_parser().parse_args(["serve", *sys.argv[1:]])
    forward_s = float(os.environ.get("FAKE_FORWARD_S", "0"))
    load_s = float(os.environ.get("FAKE_LOAD_S", "0"))

    def loader(settings):
        time.sleep(load_s)
        if settings.target == "broken":
            from codespec_lsp.engine.api import ModelLoadError
            raise ModelLoadError("fake: the target folder 'broken' has no weights")
        return FakeEngine(forward_s=forward_s)

    return run_server(args, loader=loader)


if __name__ == "__main__":
    sys.exit(main())
