"""The generation loop: prefix-cache reuse, then speculative.step until done, cancel, counts.

Contracts:
- Greedy output is the target's own greedy output, token for token, whatever the drafter.
- Between any two forward passes (draft or target, prefill chunks included) the cancel token is
  checked; a cancelled call returns what it has with `cancelled=True`.
- However a call ends (done, cancelled, error), both models' caches go back to their prefix
  caches holding exactly the tokens they have KV for, so the next request reuses them.
- Not thread-safe: one worker thread owns an Engine.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections import deque
from collections.abc import Iterable, Sequence

import torch

from codespec_lsp.engine import hf
from codespec_lsp.engine.adaptive import KController, VerifyTimes  # noqa: F401 (KController re-exported)
from codespec_lsp.engine.api import (CancelToken, Generation, GenerationError, GenerationResult,
                                     document_start_id, end_token_ids, fim_tokens_of)
from codespec_lsp.engine.copy_prior import CopyPrior
from codespec_lsp.engine.drafters import Drafter, ModelDrafter, NgramDrafter, Sampling
from codespec_lsp.completion.heal import Heal, HealVocab, token_texts
from codespec_lsp.engine.kvcache import PrefixCache
from codespec_lsp.engine.speculative import K_MAX, step
PREFILL_RESERVE = 64 + K_MAX + 1  # room kept after the prompt: prefill and generate cut alike
TRUNCATE_STEP = 256  # over-long prompts lose their head in steps this big (cache-friendly)


class Engine:
    def __init__(self, target, draft, tokenizer, *, preset: str, target_name: str,
                 draft_name: str | None, device: str, cache_bytes: int = 512 * 2**20,
                 drafter: str = "auto", prefill_chunk: int = 128, prefix_cache: bool = True) -> None:
        self.target_model, self.draft_model, self.tokenizer = target, draft, tokenizer
        self.preset, self.target_name, self.draft_name, self.device = preset, target_name, draft_name, device
        self.vocab_size = len(tokenizer)
        self.prefill_chunk = prefill_chunk
        self.context_window = int(getattr(target.config, "max_position_embeddings", 2048))
        self.target_cache = PrefixCache(target, cache_bytes, prefix_cache)
        self.ngram = NgramDrafter()
        self.model_drafter = None
        if draft is not None:
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
            "model": KController(prior_alpha=0.6, prior_cost=self._param_ratio()),
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
            return [self.ngram]
        if choice == "model":
            return [self.model_drafter]
        return [self.ngram, self.model_drafter]  # "auto"/"combined": free lookup first

    supports_heal = True  # generate() honours `heal` (SEAM.md), so complete.py may back up

    def reset_caches(self) -> None:
        self.target_cache.clear()
        if self.model_drafter is not None:
            self.model_drafter.prefix_cache.clear()

    @functools.cached_property
    def heal_vocab(self) -> HealVocab:
        """Each id's text and the masks token healing reads from it; made on first use."""
        return HealVocab(token_texts(self.tokenizer, self.vocab_size))

    @functools.cached_property
    def line_breaks(self) -> dict[int, int]:
        """The ids whose text holds newlines, and how many (the copy prior's first-line limit)."""
        return {i: t.count("\n") for i, t in enumerate(self.heal_vocab.texts) if "\n" in t}

    def set_prefix_cache(self, enabled: bool) -> None:
        """Benchmarks compare against a cold start; the server always keeps it on."""
        self.reset_caches()
        self.target_cache.enabled = enabled
        if self.model_drafter is not None:
            self.model_drafter.prefix_cache.enabled = enabled

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
        is_cancelled = (lambda: cancel is not None and cancel.cancelled)
        result = GenerationResult(stop_reason="max_tokens")
        stores = [self.target_cache]
        if self.model_drafter is not None:
            stores.append(self.model_drafter.prefix_cache)
        self._cancel = cancel
        try:
            for i, store in enumerate(stores):
                kv = store.acquire(key, seq)
                reused, done = len(kv), False
                try:
                    done = kv.prefill(seq[len(kv):-1], self.prefill_chunk, is_cancelled)
                except BaseException:
                    kv.reset()  # mid-forward: the layers may hold different lengths
                    raise
                finally:
                    store.release(key, kv)
                if i == 0:
                    result.reused_tokens = reused
                    result.prefill_tokens = len(seq) - 1 - reused if done else 0
                if not done:
                    result.cancelled, result.stop_reason = True, "cancelled"
                    break
        finally:
            self._cancel = None
        result.wall_s = result.prefill_s = time.perf_counter() - started
        return result

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

    def _plan(self, sources: list[Drafter], room: int) -> list[tuple[Drafter, int]]:
        """(drafter, K) for each source, K from its controller (or fixed_k), at most `room`."""
        verify_cost, one = self.verify_times.costs(), self.verify_times.one()
        plan = []
        for source in sources:
            ctl = self.controllers[source.name]
            k = self.fixed_k if self.fixed_k is not None else ctl.choose(one, verify_cost)
            plan.append((source, max(min(k, room), 0)))
        return plan

    def generate(self, ids: list[int], *, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None, cancel: CancelToken | None = None,
                 speculative: bool = True, key: str | None = None, lookup_ids: Sequence[int] = (),
                 heal: str = "", words: Iterable[str] = (), drafter: str | None = None,
                 copy_weight: float = 0.0) -> Generation:
        """A Generation: iterate it for new token ids, `close()` it to stop; `.result` has counts.
        `heal`: the generated text must start with it (token healing; see heal.py). `words`: the
        document's identifiers, which a word `heal` ends inside leans to (heal.Heal).
        `copy_weight`: how much of the copy prior (copy_prior.py) is mixed into the target's
        distribution; 0, the default, leaves the target's own."""
        result = GenerationResult()
        steps = self._steps(list(ids), result, max_new_tokens, temperature, top_p, seed, cancel,
                            speculative, key, list(lookup_ids), heal, list(words), drafter,
                            copy_weight)
        return Generation(steps, result)

    def _steps(self, ids, result: GenerationResult, max_new_tokens, temperature, top_p, seed,
               cancel, speculative, key, lookup, heal, words, drafter, copy_weight):
        started = time.perf_counter()
        is_cancelled = (lambda: cancel is not None and cancel.cancelled)
        seq = self.fit(ids, reserve=max(PREFILL_RESERVE, max_new_tokens + K_MAX + 1))
        prompt_len = len(seq)
        sampling = None
        if temperature > 0:
            device = next(self.target_model.parameters()).device
            generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
            sampling = Sampling(temperature, top_p, generator)
        healing = Heal(self.heal_vocab, heal, words) if heal else None
        copying = CopyPrior(copy_weight, line_breaks=self.line_breaks, prompt_len=len(seq),
                            typed_breaks=heal.count("\n")) if copy_weight > 0 else None
        sources = self.sources(speculative, drafter)
        draft_forwards_before = sum(s.forwards for s in sources)

        target = self.target_cache.acquire(key, seq)
        result.reused_tokens = len(target)
        self._cancel = cancel
        failed = False
        try:
            for source in sources:
                source.begin(key, seq, lookup)
            t0 = time.perf_counter()
            done = target.prefill(seq[len(target):-1], self.prefill_chunk, is_cancelled)
            result.prefill_s = time.perf_counter() - t0
            if done:
                result.prefill_tokens = prompt_len - result.reused_tokens
            else:
                result.cancelled = True
            while not result.cancelled and result.stop_reason == "max_tokens":
                new_count = len(seq) - prompt_len
                if new_count >= max_new_tokens:
                    break
                plan = self._plan(sources, room=max_new_tokens - new_count - 1)
                try:
                    out = step(target, seq, plan, sampling, self.vocab_size, cancel, healing, copying)
                except hf.ForwardCancelled:
                    result.cancelled = True  # stopped between layers; the forward was rolled back
                    break
                result.draft_s += out.draft_s if sources else 0.0  # target-only: no drafting time
                result.verify_s += out.verify_s
                result.target_forwards += 1
                self._record_verify(out.fed, out.verify_s)
                new = out.tokens
                ends = [i for i, t in enumerate(new) if t in self.stop_ids]
                if ends:
                    new, result.stop_reason = new[:ends[0] + 1], "eos"
                new = new[:max_new_tokens - new_count]
                if out.source is not None:
                    self.controllers[out.source.name].record(out.proposed, out.kept, out.draft_s,
                                                             len(new), out.draft_s + out.verify_s)
                    result.proposed += out.proposed
                    result.accepted += min(out.kept, len(new))  # drafts after an end token don't count
                seq.extend(new)
                if healing is not None:
                    healing.accept(new)
                for tok, lp in zip(new, out.logprobs):
                    if tok in self.stop_ids:
                        break
                    result.tokens.append(tok)
                    result.logprobs.append(lp)
                    yield tok
                if is_cancelled():
                    result.cancelled = True
        except torch.OutOfMemoryError as exc:
            failed = True
            result.stop_reason = "error"
            context = len(seq)
            self._discard(target)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            raise GenerationError(
                f"out of GPU memory at {context} tokens of context: lower the context budget or "
                f"max tokens, or pick a smaller preset ({exc.__class__.__name__})") from exc
        except BaseException as exc:
            if not isinstance(exc, GeneratorExit):
                failed = True  # mid-forward: the layers may hold different lengths, keep nothing
                result.stop_reason = "error"
                self._discard(target)
            raise
        finally:
            self._cancel = None
            if not failed:
                target.crop(min(len(target), len(seq)))  # e.g. drops KV after an end token
                self.target_cache.release(key, target)
            for source in sources:
                source.end(key, None if failed else seq)
            if result.cancelled:
                result.stop_reason = "cancelled"
            result.draft_forwards = sum(s.forwards for s in sources) - draft_forwards_before
            result.wall_s = time.perf_counter() - started
            result.other_s = max(result.wall_s - result.prefill_s - result.draft_s - result.verify_s, 0.0)

    def _discard(self, target) -> None:
        self.reset_caches()
        target.reset()

    def _record_verify(self, n: int, seconds: float) -> None:
        self.target_forward_s.append(seconds)
        self.verify_times.record(n, seconds)
