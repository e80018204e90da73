"""The generation loop: prefix-cache reuse, drafting, verification, rollback, cancel, counts.

Contracts:
- Greedy output is the target's own greedy output, token for token, whatever the drafter.
- Between any two forward passes (draft or target, prefill chunks included) the cancel token is
  checked; a cancelled call returns what it has with `cancelled=True`.
- However a call ends (done, cancelled, error), both models' caches go back to their prefix
  caches holding exactly the tokens they have KV for, so the next request reuses them.
- Not thread-safe: one worker thread owns an Engine.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

import torch

from codespec_lsp.engine import hf
from codespec_lsp.engine.api import CancelToken, GenerationError, GenerationResult
from codespec_lsp.engine.drafters import Drafter, ModelDrafter, NgramDrafter, Proposal, Sampling
from codespec_lsp.engine.kvcache import PrefixCache
from codespec_lsp.engine.speculative import adjust_probs, best_k, verify_greedy, verify_sampled

K_MAX = 8
TRUNCATE_STEP = 256  # over-long prompts lose their head in steps this big (cache-friendly)
PROBE_EVERY = 16  # steps at K = 0 before one probe at K = 1, so a drafter that improves is noticed


class KController:
    """Adaptive K for one draft source, from its measured acceptance and cost.

    Acceptance: each drafted position is a Bernoulli(alpha) trial until the first rejection,
    so alpha = kept / (kept + rejections), counted with decay so it follows the current request.
    Cost: the source's time per proposed token and the target's time for n verified tokens,
    both measured, in units of a 1-token target forward.
    """

    def __init__(self, prior_alpha: float, prior_cost: float, k_max: int = K_MAX) -> None:
        self.k_max = k_max
        self.kept, self.trials = prior_alpha * 4, 4.0  # a prior worth four observed positions
        self.draft_s: float | None = None
        self.prior_cost = prior_cost
        self.idle_steps = 0

    @property
    def alpha(self) -> float:
        return self.kept / self.trials

    def cost(self, target_s: float | None) -> float:
        if self.draft_s is None or not target_s:
            return self.prior_cost
        return self.draft_s / target_s

    def choose(self, target_s: float | None, verify_cost: list[float]) -> int:
        k = best_k(self.alpha, self.cost(target_s), verify_cost, self.k_max)
        if k == 0:
            self.idle_steps += 1
            if self.idle_steps >= PROBE_EVERY:
                self.idle_steps = 0
                return 1
        return k

    def record(self, proposed: int, kept: int, seconds: float) -> None:
        decay = 0.9
        rejections = 1 if kept < proposed else 0
        self.kept = self.kept * decay + kept
        self.trials = self.trials * decay + kept + rejections
        if proposed:
            per_token = seconds / proposed
            self.draft_s = per_token if self.draft_s is None else 0.8 * self.draft_s + 0.2 * per_token


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
        # None: K adapts (KController). A number pins K for every draft source: for benchmarks
        # that show what drafting at a loss would buy, never for serving.
        self.fixed_k: int | None = None
        self.controllers = {
            "ngram": KController(prior_alpha=0.5, prior_cost=0.01),
            "model": KController(prior_alpha=0.6, prior_cost=self._param_ratio()),
        }
        # The request being served, checked before every decoder layer (hf.install_cancel_check).
        self._cancel: CancelToken | None = None
        for model in {id(m): m for m in (target, draft) if m is not None}.values():
            hf.install_cancel_check(model, self._should_stop)
        self.target_forward_s: deque[float] = deque(maxlen=512)  # recent target forward times
        self._verify_s: dict[int, float] = {}                     # n tokens -> EMA seconds

    def _should_stop(self) -> bool:
        return self._cancel is not None and self._cancel.cancelled

    def _param_ratio(self) -> float:
        if self.draft_model is None:
            return 1.0
        count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
        return count(self.draft_model) / count(self.target_model)

    @property
    def fim_tokens(self) -> tuple[str, str, str] | None:
        vocab = self.tokenizer.get_vocab()
        for names in (("<PRE>", "<SUF>", "<MID>"), ("▁<PRE>", "▁<SUF>", "▁<MID>"),
                      ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")):
            if all(n in vocab for n in names):
                return names
        return None

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def sources(self, speculative: bool, drafter: str | None = None) -> list[Drafter]:
        choice = drafter or self.drafter
        if not speculative:
            return []
        if choice == "ngram" or self.model_drafter is None:
            return [self.ngram]
        if choice == "model":
            return [self.model_drafter]
        return [self.ngram, self.model_drafter]  # "auto"/"combined": free lookup first

    def reset_caches(self) -> None:
        self.target_cache.clear()
        if self.model_drafter is not None:
            self.model_drafter.prefix_cache.clear()

    def set_prefix_cache(self, enabled: bool) -> None:
        """Benchmarks compare against a cold start; the server always keeps it on."""
        self.reset_caches()
        self.target_cache.enabled = enabled
        if self.model_drafter is not None:
            self.model_drafter.prefix_cache.enabled = enabled

    def prefill(self, prompt: str, cancel: CancelToken | None = None) -> int:
        """Bring `prompt` into both models' prefix caches without generating (e.g. when a file is
        opened), so the first completion there pays only for what was typed since.
        Returns the target tokens run."""
        seq = self.encode_prompt(prompt, reserve=K_MAX + 1)
        is_cancelled = (lambda: cancel is not None and cancel.cancelled)
        stores = [self.target_cache]
        if self.model_drafter is not None:
            stores.append(self.model_drafter.prefix_cache)
        ran = 0
        self._cancel = cancel
        try:
            for store in stores:
                cache, reused = store.acquire(seq)
                try:
                    hf.prefill(store.model, seq[reused:-1], cache, self.prefill_chunk, is_cancelled)
                finally:
                    store.release(seq, cache)
                ran = ran or len(seq) - 1 - reused
        finally:
            self._cancel = None
        return ran

    # -- the loop ---------------------------------------------------------------------------

    def encode_prompt(self, prompt: str, reserve: int) -> list[int]:
        """BOS + the prompt's ids, cut from the left when they would not leave `reserve` positions.
        The cut moves in steps of TRUNCATE_STEP tokens, so the start stays put while the user types
        and the prefix cache keeps hitting even for a caller that sends the whole file."""
        ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        room = max(self.context_window - reserve - 1, 1)
        if len(ids) > room:
            drop = min(-(-(len(ids) - room) // TRUNCATE_STEP) * TRUNCATE_STEP, len(ids) - 1)
            ids = ids[drop:][-room:]
        bos = self.tokenizer.bos_token_id
        return ([bos] if bos is not None else []) + ids

    def _verify_cost(self) -> list[float]:
        one = self._verify_s.get(1)
        costs = []
        for k in range(K_MAX + 1):
            measured = self._verify_s.get(k + 1)
            costs.append(measured / one if (measured and one) else 1.0 + 0.05 * k)
        costs[0] = 1.0
        return costs

    def _draft(self, sources: list[Drafter], seq: list[int], room: int, sampling: Sampling | None,
               cancel: CancelToken | None) -> tuple[Proposal, str | None, float]:
        verify_cost = self._verify_cost()
        for source in sources:
            ctl = self.controllers[source.name]
            k = self.fixed_k if self.fixed_k is not None else ctl.choose(self._verify_s.get(1), verify_cost)
            k = min(k, room)
            if k <= 0:
                continue
            start = time.perf_counter()
            proposal = source.propose(seq, k, sampling, cancel)
            if proposal.tokens:
                return proposal, source.name, time.perf_counter() - start
        return Proposal([], None), None, 0.0

    def generate(self, prompt: str, *, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, stop: Sequence[str] = (),
                 stop_fn: Callable[[str], int | None] | None = None,
                 cancel: CancelToken | None = None, speculative: bool = True,
                 lookup_text: str = "", drafter: str | None = None,
                 seed: int | None = None) -> GenerationResult:
        started = time.perf_counter()
        is_cancelled = (lambda: cancel is not None and cancel.cancelled)
        seq = self.encode_prompt(prompt, reserve=max_new_tokens + K_MAX + 1)
        prompt_len = len(seq)
        result = GenerationResult(text="", tokens=[], stop_reason="max_tokens", cancelled=False)
        sampling = None
        if temperature > 0:
            generator = torch.Generator().manual_seed(seed) if seed is not None else None
            sampling = Sampling(temperature, top_p, generator)
        sources = self.sources(speculative, drafter)
        lookup = self.tokenizer.encode(lookup_text, add_special_tokens=False) if lookup_text else []
        draft_forwards_before = sum(s.forwards for s in sources)

        cache, reused = self.target_cache.acquire(seq)
        result.reused_tokens, result.prefill_tokens = reused, prompt_len - reused
        self._cancel = cancel
        try:
            for source in sources:
                source.begin(seq, lookup)
            if not hf.prefill(self.target_model, seq[reused:-1], cache, self.prefill_chunk, is_cancelled):
                result.cancelled = True
            while not result.cancelled:
                new_count = len(seq) - prompt_len
                if new_count >= max_new_tokens or result.stop_reason != "max_tokens":
                    break
                room = max_new_tokens - new_count - 1
                proposal, source_name, draft_s = self._draft(sources, seq, room, sampling, cancel)
                if is_cancelled():
                    result.cancelled = True
                    break
                try:
                    n_kept, next_token = self._verify(seq, proposal, cache, sampling)
                except hf.ForwardCancelled:
                    result.cancelled = True  # stopped between layers; the cache was rolled back
                    break
                result.target_forwards += 1
                if source_name is not None:
                    self.controllers[source_name].record(len(proposal.tokens), n_kept, draft_s)
                    result.proposed += len(proposal.tokens)
                    result.accepted += n_kept
                self._append(seq, proposal.tokens[:n_kept] + [next_token], result, max_new_tokens,
                             stop, stop_fn)
                if is_cancelled():
                    result.cancelled = True
        except torch.OutOfMemoryError as exc:
            self.reset_caches()
            context = len(seq)
            seq = []  # the caches may be half-written: keep nothing of them
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            raise GenerationError(
                f"out of GPU memory at {context} tokens of context: lower the context budget or "
                f"max tokens, or pick a smaller preset ({exc.__class__.__name__})") from exc
        finally:
            self._cancel = None
            self.target_cache.release(seq, cache)  # crops to `seq`, e.g. drops KV after an EOS
            for source in sources:
                source.end(seq)
        if result.cancelled:
            result.stop_reason = "cancelled"
            result.text = self._decode(result.tokens)
        result.draft_forwards = sum(s.forwards for s in sources) - draft_forwards_before
        result.wall_s = time.perf_counter() - started
        return result

    def _verify(self, seq: list[int], proposal: Proposal, cache, sampling: Sampling | None
                ) -> tuple[int, int]:
        """One target forward over the pending token(s) plus the proposal, then the rollback."""
        held = hf.cache_len(cache)
        feed = seq[held:] + proposal.tokens
        start = time.perf_counter()
        logits = hf.forward(self.target_model, feed, cache)[-(len(proposal.tokens) + 1):, :self.vocab_size]
        if sampling is None:
            n_kept, next_token = verify_greedy(logits, proposal.tokens)
        else:
            p = adjust_probs(logits, sampling.temperature, sampling.top_p)
            n_kept, next_token = verify_sampled(p, proposal.probs, proposal.tokens, sampling.generator)
        elapsed = time.perf_counter() - start
        self.target_forward_s.append(elapsed)
        n = len(feed)
        self._verify_s[n] = elapsed if n not in self._verify_s else 0.8 * self._verify_s[n] + 0.2 * elapsed
        hf.crop(cache, len(seq) + n_kept)  # KV rollback: drop the rejected drafts
        return n_kept, next_token

    def _decode(self, tokens: list[int]) -> str:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        # A multi-byte character split across tokens decodes to U+FFFD until its last byte arrives.
        return text.rstrip("\ufffd")

    def _append(self, seq: list[int], new: list[int], result: GenerationResult,
                max_new_tokens: int, stop: Sequence[str], stop_fn) -> None:
        eos = self.tokenizer.eos_token_id
        if eos in new:
            new = new[:new.index(eos) + 1]
            result.stop_reason = "eos"
        new = new[:max_new_tokens - len(result.tokens)]
        seq.extend(new)
        result.tokens.extend(t for t in new if t != eos)
        text = self._decode(result.tokens)
        cuts = [i for i in (text.find(s) for s in stop if s) if i >= 0]
        if stop_fn is not None:
            cut = stop_fn(text)
            if cut is not None:
                cuts.append(cut)
        if cuts:
            text = text[:min(cuts)]
            result.stop_reason = "stop"
        result.text = text
