"""`codespec-lsp bench engine`: the engine's figures on held-out Python, in one run, as JSON.

What each field means (the README quotes these):
  lossless                      speculative greedy tokens == target-only greedy tokens at every
                                point, both on the server's path (served(): token healing, the
                                lean to the document's names and the copy prior at the model's
                                measured weights, as the server runs it)
  acceptance_rate               drafted tokens the target kept / drafted tokens (every branch of
                                a step's token tree counts as drafted; only the winner's as kept)
  by_source                     per draft source: its proposed and kept tokens (its own branches)
  tokens_per_target_forward     new tokens / target verify forwards, speculative runs
  speedup                       target-only decode wall / speculative decode wall, same points,
                                both with the prompt already in the KV cache, order alternated,
                                the faster of two runs per point and mode
  next_token_accuracy           the target's greedy next-token accuracy, teacher-forced, held-out,
                                over 512-token windows
  unigram_accuracy              always guessing the held-out set's own most frequent token
  prompt_window_tokens          the prefix budget the server gives this model (default settings)
  next_token_accuracy_prompt_window   the same accuracy over windows of that many tokens
  prefill_tokens_per_keystroke  mean prompt tokens run per keystroke while typing one character
                                at a time at a 512+ token context (the first request excluded)
  ..._nocache                   the same replay with the prefix cache off
  cancel_latency_ms_p95         cancel() to generate() returning, cancels at random times while
                                decoding (prompt cached, as while typing); a cancel during a cold
                                prefill waits for one prefill chunk instead (128 tokens)
  target_forward_ms_p50         median target forward (verify) time over the run
  draft                         the draft model's folder (None: n-gram prompt lookup only)
  draft_cost_ratio              drafting seconds per proposed token / the median 1-token target
                                forward, speculative runs (speedup.py's c; None if none proposed)
  cpu_linear                    {row count: form}: where the target's CPU linears compute
                                (W @ x.T).T ("transposed") or through oneDNN's packed weight
                                ("packed"), measured faster than F.linear at load ("64": every
                                longer count, prefill chunks; engine/cpu_linear.py)
  verify_cost_by_k              a target forward over k+1 tokens in 1-token forwards, k = 0..8,
                                as adaptive K last read them (VerifyTimes; unmeasured k assumed)
  time_split_s                  per mode ("target", "spec"): seconds of prefill, draft, verify and
                                the rest, summed over the points (..._per_request_ms: per point)
  second_corpus                 points, lossless, acceptance_rate, tokens_per_target_forward,
                                speedup and the time split again on a second held-out project
                                (benchmarks/heldout, lib2to3: never trained on, never tuned on)
Adaptive K starts from its priors on each corpus, as a fresh server would.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from pathlib import Path

import torch

from codespec_lsp.config import Settings, default_context_tokens
from codespec_lsp.completion.context import ContextBuilder
from codespec_lsp.engine import hf
from codespec_lsp.completion.complete import document_words, prompt_ids, run, scoring_of
from codespec_lsp.completion.heal import healing
from codespec_lsp.engine.api import CancelToken, GenerationResult
from codespec_lsp.engine.engine import Engine
from codespec_lsp.stats import percentile

HELD_OUT = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "corpus"
# A second held-out project the pair was never tuned on: lib2to3 (scripts/train_tiny.py skips it;
# benchmarks/corpus is where the pair's defaults were measured). Adaptive K must not lose here either.
SECOND_CORPUS = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "heldout"


def corpus_files(corpus: str | Path | None) -> list[Path]:
    root = Path(corpus) if corpus else HELD_OUT
    files = sorted(p for p in root.rglob("*.py") if p.stat().st_size > 2000)
    if not files:
        raise SystemExit(f"no .py files of 2 KB or more under {root}")
    return files


def completion_points(files: list[Path], n: int, engine: Engine, context_tokens: int = 768,
                      seed: int = 0) -> list[str]:
    """Prompts ending where a user would ask for a completion: after the indentation of a
    non-blank line, with about `context_tokens` of code before it, cut at a line start."""
    rng = random.Random(seed)
    prompts = []
    texts = [f.read_text(encoding="utf-8") for f in files]
    while len(prompts) < n:
        text = rng.choice(texts)
        lines = text.splitlines(keepends=True)
        i = rng.randrange(min(60, len(lines) - 1), len(lines))
        if not lines[i].strip():
            continue
        point = sum(map(len, lines[:i])) + len(lines[i]) - len(lines[i].lstrip())
        start = i
        while start > 0 and engine.count_tokens("".join(lines[start - 1:i])) < context_tokens:
            start -= 1
        prompts.append(text[sum(map(len, lines[:start])):point])
    return prompts


def corpus_stream(engine: Engine, files: list[Path]) -> torch.Tensor:
    """The files' ids end to end, each after a BOS, as every prompt begins (training also put an
    EOS after each file; every accuracy figure in the README was measured on this stream)."""
    return torch.tensor([i for f in files for i in engine.encode(f.read_text(encoding="utf-8"))])


def next_token_accuracy(engine: Engine, stream: torch.Tensor, window: int = 512,
                        max_windows: int = 24) -> tuple[float, float]:
    """(target accuracy, most-frequent-token accuracy) on a corpus_stream, teacher-forced."""
    correct = total = 0
    device = engine.target_model.device
    with torch.inference_mode():
        for start in range(0, min(len(stream) - 1, window * max_windows), window):
            chunk = stream[start:start + window + 1]
            logits = engine.target_model(input_ids=chunk[None, :-1].to(device)).logits[0]
            correct += int((logits.argmax(-1).cpu() == chunk[1:]).sum())
            total += len(chunk) - 1
    labels = stream[1:total + 1]
    unigram = int(torch.bincount(labels).max()) / len(labels)
    return correct / total, unigram


def _step_ms(cache, context: int, step, reps: int) -> float:
    """Median ms of `step(i)`, each run after the same `context` cached positions."""
    times = []
    for i in range(reps):
        start = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - start)
        hf.crop(cache, context)
    return statistics.median(times) * 1000


def forward_ms(model, context: int = 512, reps: int = 10) -> float:
    """Median time of one 1-token forward after `context` cached tokens."""
    cache = hf.new_cache(model)
    vocab = model.config.vocab_size
    hf.forward(model, [1 + i % (vocab - 1) for i in range(context)], cache)
    return _step_ms(cache, context, lambda i: hf.forward(model, [3 + i], cache), reps)


@torch.inference_mode()
def head_step_ms(head, context: int = 512, reps: int = 10) -> float:
    """Median time of one EAGLE draft step (a 1-token layer forward and its cut LM head) after
    `context` cached entries: the head's side of the cost ratio."""
    cache = hf.new_cache(head.body)
    param = next(head.parameters())
    zeros = lambda n: torch.zeros(1, n, head.config.hidden_size, dtype=param.dtype, device=param.device)  # noqa: E731
    head(torch.ones(1, context, dtype=torch.long, device=param.device), zeros(context), cache)
    state = zeros(1)
    return _step_ms(cache, context, lambda i: head.logits(
        head(torch.tensor([[3 + i]], device=param.device), state, cache)[0, -1]), reps)


def _gen(engine: Engine, prompt: str, **options) -> GenerationResult:
    return run(engine.generate(engine.encode(prompt), **options))


def served(engine: Engine, prompt: str, **options) -> GenerationResult:
    """A generation as complete_at asks for it, under the scoring the server applies to this
    engine (complete.scoring_of: the model's measured knobs, or none with --exact): the heal
    backed up, the document's names to lean to, the copy prior."""
    scoring = scoring_of(engine)
    ids, heal = prompt_ids(engine, prompt)
    words = document_words(prompt, len(prompt), heal) if scoring.word_bias > 0 else ()
    return run(engine.generate(ids, constraint=healing(engine, heal, words, scoring.word_bias),
                               copy_weight=scoring.copy_weight, **options))


def _prefill(engine: Engine, prompt: str, key: str | None = None) -> GenerationResult:
    return engine.prefill(engine.encode(prompt), key=key)


def measure_pair(engine: Engine, points: int = 8) -> dict:
    """Acceptance of the draft model (or EAGLE head) alone and its cost ratio, measured on the
    held-out corpus. Used by `doctor` when both models load."""
    if engine.model_drafter is None:
        raise ValueError("this engine has no draft model to measure")
    proposed = accepted = 0
    for prompt in completion_points(corpus_files(None), points, engine, seed=1):
        r = _gen(engine, prompt, max_new_tokens=32, drafter="model")
        proposed, accepted = proposed + r.proposed, accepted + r.accepted
    draft_ms = (forward_ms(engine.draft_model) if engine.draft_model is not None
                else head_step_ms(engine.eagle_head))
    target_ms = forward_ms(engine.target_model)
    return {"acceptance_rate": accepted / proposed if proposed else 0.0,
            "cost_ratio": draft_ms / target_ms, "draft_forward_ms": draft_ms,
            "target_forward_ms": target_ms}


def typing_replay(engine: Engine, text: str, at: int, keystrokes: int) -> list[int]:
    """Prefill tokens per keystroke while text[at:at+keystrokes] is typed one char at a time
    into the file, the prompt built as the server builds it (context.py)."""
    builder = ContextBuilder(engine.count_tokens, default_context_tokens(engine.context_window, 4),
                             fim_tokens=engine.fim_tokens)
    rest = text[at + keystrokes:]

    def prompt(typed: int) -> str:
        return builder.build("replay", text[:at + typed] + rest, at + typed).text

    _prefill(engine, prompt(0))  # the file was open before typing started
    return [_gen(engine, prompt(i), max_new_tokens=4).prefill_tokens
            for i in range(1, keystrokes + 1)]


def _doc(i: int, prompts: list[str]) -> str:
    """Each prompt is its own document: the prefix cache keeps one entry per document, so prompts
    sharing one key would evict each other and the cancel would land in a cold prefill."""
    return f"cancel-trial-{i % len(prompts)}"


def cancel_latencies(engine: Engine, prompts: list[str], trials: int, seed: int = 0) -> list[float]:
    """cancel() to generate() returning, in ms. Steady typing: each prompt is cached under its
    document first, so the cancel lands in decoding, not in a cold prefill."""
    for i in range(min(trials, len(prompts))):
        _prefill(engine, prompts[i], _doc(i, prompts))
    rng = random.Random(seed)
    latencies = []
    for i in range(trials):
        token, done = CancelToken(), threading.Event()
        worker = threading.Thread(target=lambda p=prompts[i % len(prompts)], k=_doc(i, prompts): (
            _gen(engine, p, max_new_tokens=200, cancel=token, key=k), done.set()))
        worker.start()
        time.sleep(rng.uniform(0.0, 0.15))
        cancelled_at = time.perf_counter()
        token.cancel()
        done.wait()
        latencies.append((time.perf_counter() - cancelled_at) * 1000)
        worker.join()
    return latencies


def speed(engine: Engine, prompts: list[str], max_tokens: int, repeats: int = 2) -> dict:
    """Target alone against speculative decoding at the same points, the prompt cached for both,
    the order alternated; adaptive K starts from its priors (a fresh server on this code). Each
    mode runs `repeats` times per point and its fastest run counts (timeit's rule: on a shared
    machine the slower runs measure the other processes, not the engine)."""
    engine.reset_adaptive()
    lossless = True
    wall = {"target": 0.0, "spec": 0.0}
    parts = ("prefill_s", "draft_s", "verify_s", "other_s")
    split = {mode: dict.fromkeys(parts, 0.0) for mode in wall}  # where each mode's time went
    proposed = accepted = spec_tokens = spec_forwards = 0
    by_source: dict[str, list[int]] = {}  # draft source -> [proposed, accepted]
    spec_draft_s = 0.0
    for i, prompt in enumerate(prompts):
        _prefill(engine, prompt)  # prompt in both caches for both runs: decode against decode
        fastest = {}
        for rep in range(repeats):
            runs = {}
            for mode in (("target", "spec") if (i + rep) % 2 == 0 else ("spec", "target")):
                runs[mode] = served(engine, prompt, max_new_tokens=max_tokens, speculative=(mode == "spec"))
                if mode not in fastest or runs[mode].wall_s < fastest[mode].wall_s:
                    fastest[mode] = runs[mode]
            lossless &= runs["spec"].tokens == runs["target"].tokens
            proposed += runs["spec"].proposed
            accepted += runs["spec"].accepted
            for name, (p, a) in runs["spec"].by_source.items():
                counts = by_source.setdefault(name, [0, 0])
                counts[0], counts[1] = counts[0] + p, counts[1] + a
            spec_tokens += len(runs["spec"].tokens)
            spec_forwards += runs["spec"].target_forwards
            spec_draft_s += runs["spec"].draft_s
        for mode, run_ in fastest.items():
            wall[mode] += run_.wall_s
            for part in parts:
                split[mode][part] += getattr(run_, part)
    return {
        "points": len(prompts),
        "lossless": lossless,
        "acceptance_rate": round(accepted / proposed, 4) if proposed else 0.0,
        "by_source": {name: {"proposed": p, "accepted": a, "acceptance_rate": round(a / p, 4) if p else 0.0}
                      for name, (p, a) in sorted(by_source.items())},
        "tokens_per_target_forward": round(spec_tokens / max(spec_forwards, 1), 3),
        "speedup": round(wall["target"] / wall["spec"], 3),
        "draft_cost_ratio": _cost_ratio(engine, spec_draft_s, proposed),
        "verify_cost_by_k": [round(c, 3) for c in engine.verify_times.costs()],
        "time_split_s": {m: {k: round(v, 4) for k, v in d.items()} for m, d in split.items()},
        "time_split_per_request_ms": {
            m: {k.removesuffix("_s") + "_ms": round(v * 1000 / len(prompts), 3) for k, v in d.items()}
            for m, d in split.items()},
    }


def _cost_ratio(engine: Engine, draft_s: float, proposed: int) -> float | None:
    """Drafting seconds per proposed token over the median 1-token target forward, as the run
    measured them (the c of engine/speedup.py); None when nothing was proposed or timed."""
    one = engine.verify_times.one()
    if not proposed or not one:
        return None
    return round(draft_s / proposed / one, 4)


def engine_bench(engine: Engine, corpus: str | None = None, points: int = 24,
                 max_tokens: int = 48, keystrokes: int = 40, cancel_trials: int = 20,
                 second_corpus: str | Path | None = SECOND_CORPUS) -> dict:
    files = corpus_files(corpus)
    prompts = completion_points(files, points, engine)
    _gen(engine, prompts[0], max_new_tokens=8)  # first-call allocations out of the timings
    engine.target_forward_s.clear()
    main = speed(engine, prompts, max_tokens)
    forward_p50 = statistics.median(engine.target_forward_s) * 1000
    second = None
    if second_corpus is not None:
        second = {"corpus": Path(second_corpus).name,
                  **speed(engine, completion_points(corpus_files(second_corpus), points, engine), max_tokens)}

    stream = corpus_stream(engine, files)
    accuracy, unigram = next_token_accuracy(engine, stream)
    # Completion prompts run far longer than 512 tokens; a model trained on short windows loses
    # accuracy past them (RoPE positions it never saw), which the 512 figure alone would hide.
    prompt_window = default_context_tokens(engine.context_window, Settings().max_tokens)
    accuracy_long, _ = next_token_accuracy(engine, stream, window=prompt_window,
                                           max_windows=max(1, 512 * 24 // prompt_window))

    text = max((f.read_text(encoding="utf-8") for f in files), key=len)
    at = len(text) // 2
    at = text.index("\n", at) + 1  # typing starts on a fresh line, ~half way into a long file
    assert engine.count_tokens(text[:at]) >= 512
    cached = typing_replay(engine, text, at, keystrokes)
    engine.set_prefix_cache(False)
    uncached = typing_replay(engine, text, at, keystrokes)
    engine.set_prefix_cache(True)

    latencies = cancel_latencies(engine, prompts, cancel_trials)
    return {
        "preset": engine.preset,
        "device": engine.device,
        "draft": engine.draft_name,
        "drafter": engine.drafter,
        "cpu_linear": {str(n): form for n, form in
                       (getattr(engine.target_model, "cpu_linear_plan", None) or {}).items()},
        **main,
        "next_token_accuracy": round(accuracy, 4),
        "unigram_accuracy": round(unigram, 4),
        "prompt_window_tokens": prompt_window,
        "next_token_accuracy_prompt_window": round(accuracy_long, 4),
        "prefill_tokens_per_keystroke": round(statistics.mean(cached), 2),
        "prefill_tokens_per_keystroke_nocache": round(statistics.mean(uncached), 1),
        "cancel_latency_ms_p95": round(percentile(latencies, 0.95), 2),
        "target_forward_ms_p50": round(forward_p50, 2),
        "second_corpus": second,
    }


def run_engine_bench(args) -> int:
    from codespec_lsp.engine import load_engine
    engine = load_engine(preset=args.preset, draft=args.draft, target=args.target, device=args.device,
                         dtype=args.dtype, allow_download=args.allow_download,
                         trust_remote_code=args.trust_remote_code, exact=getattr(args, "exact", False))
    engine.fixed_k = args.fixed_k
    result = engine_bench(engine, corpus=args.corpus, points=args.points, max_tokens=args.max_tokens)
    out = json.dumps(result, indent=2)
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(out + "\n")
    print(out)
    return 0
