"""The generation loop: prefix-cache reuse, then speculative.step until done, cancel, counts.

Contracts:
- Greedy output is the target's own greedy output under the configured scoring (the healing
  `constraint` with its name lean, the copy prior `copy_weight`), token for token, whatever the
  drafter; speculative=False gives the same tokens. It is the bare model's output only with the
  lean and the prior off (exact mode).
- Between any two forward passes (draft or target, prefill chunks included) the cancel token is
  checked, and inside a decode/verify forward between layers; a cancelled call returns what it
  has with `cancelled=True`. A prefill chunk is never stopped inside: its KV is kept, and the
  next keystroke's prompt (the same prefix, a few characters longer) needs it. Cut between
  layers, a cold file's prefill, whose chunks outlast the gap between keystrokes on a CPU, was
  thrown away at every keystroke and never finished while the user typed. The last few uncached
  prompt tokens (FIRST_STEP_PROMPT) are not prefilled: they ride in the first step's forward, which
  a cancel may cut; the next request runs them again (a few tokens, not a chunk).
- However a call ends (done, cancelled, error), both models' caches go back to their prefix
  caches holding exactly the tokens they have KV for, so the next request reuses them.
- Not thread-safe: one worker thread owns an Engine.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass

import torch

from codespec_lsp.engine import hf
from codespec_lsp.engine.adaptive import KController, VerifyTimes  # noqa: F401 (KController re-exported)
from codespec_lsp.engine.api import (CancelToken, Generation, GenerationError, GenerationResult,
                                     TokenConstraint, cancel_check, document_start_id, end_token_ids,
                                     fim_tokens_of, token_texts)
from codespec_lsp.engine.copy_prior import CopyPrior
from codespec_lsp.engine.drafters import Drafter, ModelDrafter, NgramDrafter, Sampling
from codespec_lsp.engine.eagle import EagleDrafter
from codespec_lsp.engine.kvcache import PrefixCache
from codespec_lsp.engine.speculative import K_MAX, step
PREFILL_RESERVE = 64 + K_MAX + 1  # room kept after the prompt: prefill and generate cut alike
TRUNCATE_STEP = 256  # over-long prompts lose their head in steps this big (cache-friendly)
# Uncached prompt tokens (up to this many) that ride in the first step's forward instead of a
# prefill forward of their own: a keystroke's delta is one to three tokens, and a forward over
# 3 + K tokens costs about one over 1 (engine/cpu_linear.py; on a GPU too), so this saves a
# whole forward before the first token.
FIRST_STEP_PROMPT = 4


@dataclass(frozen=True)
class GenerateOptions:
    """What one `generate` call asks for: one object, so no two settings of the loop can be passed
    in each other's place on the way from `generate` to the steps."""
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    cancel: CancelToken | None = None
    speculative: bool = True
    key: str | None = None
    lookup_ids: tuple[int, ...] = ()
    constraint: TokenConstraint | None = None
    drafter: str | None = None
    copy_weight: float = 0.0

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.cancelled


class Engine:
    def __init__(self, target, draft, tokenizer, *, preset: str, target_name: str,
                 draft_name: str | None, device: str, cache_bytes: int = 512 * 2**20,
                 drafter: str = "auto", prefill_chunk: int = 128, prefix_cache: bool = True,
                 eagle_head=None) -> None:
        self.target_model, self.draft_model, self.tokenizer = target, draft, tokenizer
        self.eagle_head = eagle_head
        self.preset, self.target_name, self.draft_name, self.device = preset, target_name, draft_name, device
        self.vocab_size = len(tokenizer)
        self.prefill_chunk = prefill_chunk
        self.context_window = int(getattr(target.config, "max_position_embeddings", 2048))
        # An EAGLE head drafts from the target's hidden states: the target's KVs keep them.
        self.target_cache = PrefixCache(target, cache_bytes, prefix_cache, keep_states=eagle_head is not None)
        self.ngram = NgramDrafter()
        # Shorter matches guess worse; as their own source, adaptive K keeps them off where they
        # do not pay without lowering the long matches' K (docs/draft.md).
        self.short_ngram = NgramDrafter(min_match=1, max_match=2, name="ngram_short")
        self.model_drafter = None
        if eagle_head is not None:
            self.model_drafter = EagleDrafter(eagle_head, self.vocab_size)
        elif draft is not None:
            self.model_drafter = ModelDrafter(draft, PrefixCache(draft, cache_bytes // 2, prefix_cache),
                                              self.vocab_size, prefill_chunk)
        self.drafter = drafter
        self.stop_ids = end_token_ids(tokenizer, getattr(getattr(target, "generation_config", None),
                                                         "eos_token_id", None))
        self.doc_start = document_start_id(tokenizer)
        # None: K adapts (KController). A number pins K for every draft source: for benchmarks
        # that show what drafting at a loss would buy, never for serving.
        self.fixed_k: int | None = None
        self.reset_adaptive()
        # The request being served, checked before every decoder layer (hf.install_cancel_check).
        self._cancel: CancelToken | None = None
        # The hooks hold the engine weakly and go when it does: a model outliving its Engine (a
        # reload, a test building several) neither keeps it alive nor runs a dead engine's checks.
        should_stop = weakref.WeakMethod(self._should_stop)
        hooks = [h for m in {id(m): m for m in (target, draft) if m is not None}.values()
                 for h in hf.install_cancel_check(m, lambda: (should_stop() or (lambda: False))())]
        weakref.finalize(self, lambda: [h.remove() for h in hooks])
        self.target_forward_s: deque[float] = deque(maxlen=512)  # recent target forward times

    def reset_adaptive(self) -> None:
        """Adaptive K from its priors again (benchmarks measure a fresh start on each corpus)."""
        self.controllers = {
            "ngram": KController(prior_alpha=0.5, prior_cost=0.01),
            "ngram_short": KController(prior_alpha=0.3, prior_cost=0.01),
            "model": KController(prior_alpha=0.6, prior_cost=self._param_ratio()),
            "eagle": KController(prior_alpha=0.5, prior_cost=0.1),
        }
        self.verify_times = VerifyTimes()  # by tokens fed: adaptive K's verify costs

    def _should_stop(self) -> bool:
        return self._cancel is not None and self._cancel.cancelled

    def _param_ratio(self) -> float:
        if self.draft_model is None:
            return 1.0
        count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
        return count(self.draft_model) / count(self.target_model)

    @property
    def fim_tokens(self) -> tuple[str, str, str] | None:
        return fim_tokens_of(self.tokenizer)

    def count_tokens(self, text: str) -> int:
        # verbose=False: counting a whole file longer than the model's window is the point here
        # (the context builder cuts it); transformers would warn of "indexing errors" each time.
        return len(self.tokenizer.encode(text, add_special_tokens=False, verbose=False))

    def sources(self, speculative: bool, drafter: str | None = None) -> list[Drafter]:
        choice = drafter or self.drafter
        if not speculative:
            return []
        if choice == "ngram" or self.model_drafter is None:
            return [self.ngram, self.short_ngram]
        if choice == "model":
            return [self.model_drafter]
        # "auto"/"combined": free long lookup first, the model, then the short lookup (the order
        # branches take in a token tree, and the order sampling asks them in)
        return [self.ngram, self.model_drafter, self.short_ngram]

    supports_heal = True  # generate() applies a healing `constraint`, so complete.py may back up

    def reset_caches(self) -> None:
        self.target_cache.clear()
        if self.model_drafter is not None:
            self.model_drafter.clear()

    @functools.cached_property
    def token_texts(self) -> list[str]:
        """Each id's text (api.token_texts): token healing and the copy prior read it."""
        return token_texts(self.tokenizer, self.vocab_size)

    @functools.cached_property
    def line_breaks(self) -> dict[int, int]:
        """The ids whose text holds newlines, and how many (the copy prior's first-line limit)."""
        return {i: t.count("\n") for i, t in enumerate(self.token_texts) if "\n" in t}

    def set_prefix_cache(self, enabled: bool) -> None:
        """Benchmarks compare against a cold start; the server always keeps it on."""
        self.reset_caches()
        self.target_cache.enabled = enabled
        if self.model_drafter is not None:
            self.model_drafter.enable_cache(enabled)

    def encode(self, text: str) -> list[int]:
        """The text's ids after the document start the model expects (api.document_start_id)."""
        start = self.doc_start
        return ([start] if start is not None else []) + self.tokenizer.encode(
            text, add_special_tokens=False, verbose=False)

    def prefill(self, ids: list[int], *, key: str | None = None,
                cancel: CancelToken | None = None) -> GenerationResult:
        """Bring `ids` into both models' prefix caches (document `key`) without generating, e.g.
        when a file is opened, so the first completion there pays only for what was typed since."""
        started = time.perf_counter()
        seq = self.fit(ids, reserve=PREFILL_RESERVE)
        is_cancelled = cancel_check(cancel)
        result = GenerationResult(stop_reason="max_tokens")
        stores = [self.target_cache]
        if self.draft_model is not None:
            stores.append(self.model_drafter.prefix_cache)
        for i, store in enumerate(stores):
            kv = store.acquire(key, seq)
            reused, done = len(kv), False
            try:
                done = self._prefill_whole(kv, seq[len(kv):-1], is_cancelled)
            except BaseException:
                kv.reset()  # mid-forward: the layers may hold different lengths
                raise
            else:
                head = self.model_drafter
                if i == 0 and done and isinstance(head, EagleDrafter) and head in self.sources(True):
                    self._warm_head(key, seq, kv, cancel)
            finally:
                store.release(key, kv)
            if i == 0:
                result.reused_tokens = reused
                result.prefill_tokens = len(seq) - 1 - reused if done else 0
            if not done:
                result.cancelled, result.stop_reason = True, "cancelled"
                break
        result.wall_s = result.prefill_s = time.perf_counter() - started
        return result

    def _warm_head(self, key: str | None, seq: list[int], target, cancel: CancelToken | None) -> None:
        """The EAGLE head's cache for document `key` brought up to the target's states of `seq`."""
        head = self.model_drafter
        head.begin(key, seq, [], (), target)
        try:
            head.catch_up(seq, cancel)
        finally:
            head.end(key, seq)

    def _prefill_whole(self, kv, ids: list[int], cancelled: Callable[[], bool]) -> bool:
        """kv.prefill with every chunk run whole (module docstring): `cancelled` is asked between
        chunks only, and the request's between-layers check is put back after."""
        held, self._cancel = self._cancel, None
        try:
            return kv.prefill(ids, self.prefill_chunk, cancelled)
        finally:
            self._cancel = held

    # -- the loop ---------------------------------------------------------------------------

    def encode_prompt(self, prompt: str, reserve: int) -> list[int]:
        return self.fit(self.encode(prompt), reserve)

    def fit(self, ids: list[int], reserve: int) -> list[int]:
        """`ids` (BOS first when the model has one) cut from the left when they would not leave
        `reserve` positions. The cut moves in steps of TRUNCATE_STEP tokens, so the start stays put
        while the user types and the prefix cache keeps hitting for a caller sending the whole file."""
        start = self.doc_start
        head = ids[:1] if (start is not None and ids[:1] == [start]) else []
        ids = ids[len(head):]
        reserve = min(reserve, self.context_window // 2)  # a small model still sees its prompt
        room = max(self.context_window - reserve - len(head), 1)
        if len(ids) > room:
            drop = min(-(-(len(ids) - room) // TRUNCATE_STEP) * TRUNCATE_STEP, len(ids) - 1)
            ids = ids[drop:][-room:]
        return head + list(ids)

    def _plan(self, sources: list[Drafter], room: int) -> list[tuple[Drafter, Callable[[int], int]]]:
        """(drafter, K for it given the tree rows already drafted this step) for each source, K
        from its controller (or fixed_k), at most `room`. A branch joining a tree pays only the
        rows it adds: a CPU forward over 4 tokens costs about 1.4 one-token forwards and over 9
        about 1.55, so a source asked after another has drafted is planned on the marginal cost
        (with the whole cost, the head drafted one token where three were nearly free)."""
        verify_cost, one = self.verify_times.costs(), self.verify_times.one()

        def k_of(source: Drafter) -> Callable[[int], int]:
            def k(rows: int) -> int:
                if self.fixed_k is not None:
                    return max(min(self.fixed_k, room), 0)
                chosen = self.controllers[source.name].choose(one, marginal_costs(verify_cost, rows))
                return max(min(chosen, room, K_MAX - rows), 0)
            return k
        return [(source, k_of(source)) for source in sources]

    def generate(self, ids: list[int], *, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None, cancel: CancelToken | None = None,
                 speculative: bool = True, key: str | None = None, lookup_ids: Sequence[int] = (),
                 constraint: TokenConstraint | None = None, drafter: str | None = None,
                 copy_weight: float = 0.0) -> Generation:
        """A Generation: iterate it for new token ids, `close()` it to stop; `.result` has counts.
        `constraint`: a rule on the target's scores, fresh for this generation (token healing:
        completion.heal.healing builds it; its `rest` is the text the answer must start with).
        `copy_weight`: how much of the copy prior (copy_prior.py) is mixed into the target's
        distribution; 0, the default, leaves the target's own."""
        options = GenerateOptions(max_new_tokens, temperature, top_p, seed, cancel, speculative, key,
                                  tuple(lookup_ids), constraint, drafter, copy_weight)
        result = GenerationResult()
        return Generation(_Run(self, list(ids), result, options).steps(), result)

    def _discard(self, target) -> None:
        self.reset_caches()
        target.reset()

    def _record_verify(self, n: int, seconds: float) -> None:
        self.target_forward_s.append(seconds)
        self.verify_times.record(n, seconds)


def marginal_costs(verify_cost: list[float], rows: int) -> list[float]:
    """verify_cost as seen by a branch added to `rows` drafted tokens: 1 + what its K tokens add
    to the forward (speedup.best_k's form); lengths past the list cannot be drafted."""
    if rows <= 0:
        return verify_cost
    base = verify_cost[min(rows, len(verify_cost) - 1)]
    return [1.0] + [1.0 + verify_cost[rows + k] - base if rows + k < len(verify_cost) else float("inf")
                    for k in range(1, len(verify_cost))]


def _by_source(out) -> dict[str, tuple[int, int, float, bool]]:
    """Per source in a step: (tokens proposed, most kept by one of its branches, seconds drafting,
    whether it won). A source may have several branches (the EAGLE head's runner-up)."""
    tally: dict[str, tuple[int, int, float, bool]] = {}
    for i, branch in enumerate(out.branches):
        proposed, kept, draft_s, won = tally.get(branch.source.name, (0, 0, 0.0, False))
        tally[branch.source.name] = (proposed + len(branch.tokens), max(kept, branch.kept),
                                     draft_s + branch.draft_s, won or i == out.winner)
    return tally


class _Run:
    """One generation: its sequence, counts, and the target KV it holds. `steps()` is the generator
    behind the Generation, so nothing (the cut, the cache acquire) happens before the first next();
    however it ends, `_finish` hands the KV back (module contracts)."""

    def __init__(self, engine: Engine, ids: list[int], result: GenerationResult,
                 opts: GenerateOptions) -> None:
        self.engine, self.ids, self.result, self.opts = engine, ids, result, opts
        self.seq: list[int] = []
        self.prompt_len = 0
        self.sources: list[Drafter] = []

    def steps(self) -> Generator[int, None, None]:
        engine, opts, result = self.engine, self.opts, self.result
        started = time.perf_counter()
        seq = self.seq = engine.fit(self.ids, reserve=max(PREFILL_RESERVE, opts.max_new_tokens + K_MAX + 1))
        self.prompt_len = len(seq)
        sampling, copying = self._sampling(), self._copy_prior()
        sources = self.sources = engine.sources(opts.speculative, opts.drafter)
        draft_forwards_before = sum(s.forwards for s in sources)
        target = engine.target_cache.acquire(opts.key, seq)
        result.reused_tokens = len(target)
        engine._cancel = opts.cancel
        failed = False
        try:
            opening = list(getattr(opts.constraint, "opening", None) or ())
            for source in sources:
                source.begin(opts.key, seq, list(opts.lookup_ids), opening, target)
            self._prefill(target)
            # drafting forwards only: a drafter's catch-up with a new prompt is prefill, and the
            # target's prefill forwards are not counted either
            draft_forwards_before = sum(s.forwards for s in sources)
            while not result.cancelled and result.stop_reason == "max_tokens":
                new_count = len(seq) - self.prompt_len
                if new_count >= opts.max_new_tokens:
                    break
                if opts.constraint is not None and opts.constraint.stuck:
                    result.stop_reason = "heal"  # nothing the vocabulary has can re-type the rest
                    break
                plan = engine._plan(sources, room=opts.max_new_tokens - new_count - 1)
                try:
                    out = step(target, seq, plan, sampling, engine.vocab_size, opts.cancel,
                               opts.constraint, copying)
                except hf.ForwardCancelled:
                    result.cancelled = True  # stopped between layers; the forward was rolled back
                    break
                new = self._keep(out, new_count)
                for tok, lp in zip(new, out.logprobs):
                    if tok in engine.stop_ids:
                        break
                    result.tokens.append(tok)
                    result.logprobs.append(lp)
                    yield tok
                if opts.cancelled():
                    result.cancelled = True
        except torch.OutOfMemoryError as exc:
            failed = True
            raise self._out_of_memory(target, exc) from exc
        except BaseException as exc:
            if not isinstance(exc, GeneratorExit):
                failed = True  # mid-forward: the layers may hold different lengths, keep nothing
                result.stop_reason = "error"
                engine._discard(target)
            raise
        finally:
            engine._cancel = None
            self._finish(target, failed, started, draft_forwards_before)

    def _sampling(self) -> Sampling | None:
        opts = self.opts
        if opts.temperature <= 0:
            return None
        device = next(self.engine.target_model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(opts.seed) if opts.seed is not None else None
        return Sampling(opts.temperature, opts.top_p, generator)

    def _copy_prior(self) -> CopyPrior | None:
        if self.opts.copy_weight <= 0:
            return None
        typed = self.opts.constraint.rest if self.opts.constraint is not None else ""
        return CopyPrior(self.opts.copy_weight, line_breaks=self.engine.line_breaks,
                         prompt_len=len(self.seq), typed_breaks=typed.count("\n"))

    def _prefill(self, target) -> None:
        t0 = time.perf_counter()
        upto = max(len(target), len(self.seq) - FIRST_STEP_PROMPT)  # the rest: the first step's
        done = self.engine._prefill_whole(target, self.seq[len(target):upto], self.opts.cancelled)
        head = self.engine.model_drafter
        if done and head in self.sources:  # a new prompt's share of the drafter is prefill work too
            if isinstance(head, EagleDrafter):
                head.catch_up(self.seq, self.opts.cancel)
            elif isinstance(head, ModelDrafter):
                done = head.catch_up(self.seq, upto, self.opts.cancel)
        self.result.prefill_s = time.perf_counter() - t0
        if done:
            self.result.prefill_tokens = self.prompt_len - self.result.reused_tokens
        else:
            self.result.cancelled = True

    def _keep(self, out, new_count: int) -> list[int]:
        """The step's tokens this generation keeps (to an end token, within max_new_tokens),
        counted, recorded for adaptive K, appended to seq and passed to the constraint."""
        engine, result = self.engine, self.result
        result.draft_s += out.draft_s if self.sources else 0.0  # target-only: no drafting time
        result.verify_s += out.verify_s
        result.target_forwards += 1
        engine._record_verify(out.fed, out.verify_s)
        new = out.tokens
        ends = [i for i, t in enumerate(new) if t in engine.stop_ids]
        if ends:
            new, result.stop_reason = new[:ends[0] + 1], "eos"
        new = new[:self.opts.max_new_tokens - new_count]
        for name, (proposed, kept, draft_s, won) in _by_source(out).items():
            # Acceptance from its own branches; the realised rate from the whole step, which its
            # branch joined (judged by its own branch alone, paying for the other's rows, the
            # EAGLE head read as slower than the target and was switched off where it added most).
            engine.controllers[name].record(proposed, kept, draft_s, len(new), out.draft_s + out.verify_s)
            kept = min(kept, len(new))  # drafts after an end token don't count
            result.proposed += proposed
            result.accepted += kept if won else 0
            counts = result.by_source.setdefault(name, [0, 0])
            counts[0], counts[1] = counts[0] + proposed, counts[1] + kept
        self.seq.extend(new)
        if self.opts.constraint is not None:
            self.opts.constraint.accept(new)
        return new

    def _out_of_memory(self, target, exc: BaseException) -> GenerationError:
        self.result.stop_reason = "error"
        context = len(self.seq)
        self.engine._discard(target)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return GenerationError(
            f"out of GPU memory at {context} tokens of context: lower the context budget or "
            f"max tokens, or pick a smaller preset ({exc.__class__.__name__})")

    def _finish(self, target, failed: bool, started: float, draft_forwards_before: int) -> None:
        engine, result = self.engine, self.result
        if not failed:
            target.crop(min(len(target), len(self.seq)))  # e.g. drops KV after an end token
            engine.target_cache.release(self.opts.key, target)
        for source in self.sources:
            source.end(self.opts.key, None if failed else self.seq)
        if result.cancelled:
            result.stop_reason = "cancelled"
        result.draft_forwards = sum(s.forwards for s in self.sources) - draft_forwards_before
        result.wall_s = time.perf_counter() - started
        result.other_s = max(result.wall_s - result.prefill_s - result.draft_s - result.verify_s, 0.0)
