"""The engine's public contract: what goes in, what comes out, how it is stopped.

The engine knows token ids, text and tensors; it never imports lsprotocol. Everything it
returns carries its counts, so stats and benchmarks read the same numbers the engine used.
Both backends (this engine and remote/) implement the same seam: `generate`, `prefill`, `encode`,
`token_texts`, `supports_heal`. Rules on the target's scores (token healing) are built by the
completion layer and handed in as a TokenConstraint: the backends apply them, never build them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the seam's importers (the protocol layer) never load torch for it
    import torch


class ModelLoadError(RuntimeError):
    """A model pair could not be loaded. The message is written for the user, not a traceback."""


class TokenizerMismatchError(ModelLoadError):
    """Draft and target tokenize differently: speculative decoding would accept nothing."""


class MissingExtraError(ModelLoadError):
    """A preset needs an optional dependency (e.g. the `gptq` extra) that is not installed."""


class CancelToken:
    """Set from any thread; the engine checks it between forward passes."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


def cancel_check(cancel: CancelToken | None) -> Callable[[], bool]:
    """A check for the loops that take an optional token (KV.prefill's `cancelled`): without a
    token, never cancelled."""
    return (lambda: cancel.cancelled) if cancel is not None else (lambda: False)


@dataclass
class GenerationResult:
    text: str = ""            # decoded new text (complete.py fills it after detokenizing)
    tokens: list[int] = field(default_factory=list)  # new token ids
    # "max_tokens" | "eos" | "stop" | "cancelled" | "error" | "heal" (no token can re-type `heal`)
    stop_reason: str = "max_tokens"
    cancelled: bool = False
    target_forwards: int = 0  # decode/verify forwards; prefill chunks are counted in prefill_tokens
    draft_forwards: int = 0
    proposed: int = 0         # draft tokens sent to the target for verification
    accepted: int = 0         # of those, how many the target kept
    # the same two counts per draft source ("ngram", "eagle", ...): which one pays, and where
    by_source: dict[str, list[int]] = field(default_factory=dict)  # name -> [proposed, accepted]
    prefill_tokens: int = 0   # prompt tokens the target had to run (not served from the KV cache)
    reused_tokens: int = 0    # prompt tokens served from the target's KV prefix cache
    wall_s: float = 0.0
    # The target's log-prob of each token in `tokens`, under token healing's scores where they
    # apply (heal.Heal: given what was typed, as the confidence gate should judge it).
    logprobs: list[float] = field(default_factory=list)
    prefill_s: float = 0.0    # where wall_s went: prompt prefill, drafting, verify forwards, the rest
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_target_forward(self) -> float:
        decode_forwards = max(self.target_forwards, 1)
        return len(self.tokens) / decode_forwards

    def to_dict(self) -> dict:
        d = asdict(self)
        d["acceptance_rate"] = self.acceptance_rate
        d["tokens_per_target_forward"] = self.tokens_per_target_forward
        return d


class Generation:
    """An iterator of new token ids; the caller decides when to stop (`close()`).

    `result` is kept up to date while it runs and is final after exhaustion or close; every way
    out leaves the engine's caches consistent (the wrapped generator's `finally` does that)."""

    def __init__(self, steps: Generator[int, None, None], result: GenerationResult) -> None:
        self._steps, self.result, self.done = steps, result, False

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        if self.done:
            raise StopIteration
        try:
            return next(self._steps)
        except BaseException:
            self.done = True
            raise

    def close(self) -> None:
        """Stop here: the caller has what it wants (stop_reason "stop" unless it had ended)."""
        if not self.done:
            self.done = True
            if self.result.stop_reason == "max_tokens" and not self.result.cancelled:
                self.result.stop_reason = "stop"
            self._steps.close()

    def __enter__(self) -> "Generation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TokenConstraint(Protocol):
    """A rule on the target's scores for one generation (completion.heal.Heal, token healing).

    The caller builds a fresh one per generation; the backend calls `mask` on every verify
    forward (so greedy speculative output stays the target's own under the rule) and `accept`
    with the tokens it keeps. A remote backend, which cannot touch the server's logits, asks
    `allowed(rest)` for the ids that may re-type `rest`."""

    rest: str  # the text the next tokens must still re-type ("" once it is re-typed)
    opening: list[int]  # the ids it expects first ([]: no guess); the engine drafts them for free
    stuck: bool  # no token may go on: the generation ends (stop_reason "heal"), never a -inf row

    def mask(self, logits: "torch.Tensor", drafted: list[int]) -> "torch.Tensor":
        """logits [K+1, V] (row i: the token after drafted[:i]) under the rule; a new tensor."""

    def accept(self, tokens: list[int]) -> None:
        """The generation kept `tokens`: the rule moves on past them."""

    def allowed(self, rest: str, device: "torch.device | str" = "cpu") -> "torch.Tensor":
        """[V] bool: the ids a token may take while `rest` is still to be re-typed."""


class GenerationError(RuntimeError):
    """Generation failed at run time (e.g. out of GPU memory). The caches were reset; the engine
    is usable again for the next request."""


# Infill token spellings by model family: CodeLlama base (with and without SentencePiece's space
# marker), StarCoder-style. Prefix-only models (CodeLlama-*-Python, tiny) have none.
FIM_TOKEN_NAMES = (("<PRE>", "<SUF>", "<MID>"), ("\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>"),
                   ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))


def token_texts(tokenizer, vocab_size: int) -> list[str]:
    """Each id's text as it reads after other text (decoders such as CodeLlama's strip the leading
    space of a text's first token, so every id is decoded behind a context id). Special tokens and
    incomplete UTF-8 pieces read as "" and are never allowed while healing."""
    context = tokenizer.encode("a", add_special_tokens=False)[-1:]
    head = tokenizer.decode(context, skip_special_tokens=True)
    texts = tokenizer.batch_decode([context + [i] for i in range(vocab_size)], skip_special_tokens=True)
    return [t[len(head):] if t.startswith(head) and "\ufffd" not in t else "" for t in texts]


def fim_tokens_of(tokenizer) -> tuple[str, str, str] | None:
    """The (prefix, suffix, middle) infill tokens `tokenizer` has, or None: prefix-only model."""
    if tokenizer is None:
        return None
    vocab = tokenizer.get_vocab()
    return next((names for names in FIM_TOKEN_NAMES if all(n in vocab for n in names)), None)



# End-of-text spellings across families: CodeLlama's infill end, the StarCoder/SmolLM document
# separator, the ChatML turn end (SmolLM2-Instruct ends answers with it). Every one present stops
# a completion, locally and on a remote server (sent as vLLM's stop_token_ids).
END_TOKEN_NAMES = ("<EOT>", "\u2581<EOT>", "<|endoftext|>", "<|im_end|>", "<|end_of_text|>")
# A chat model's BOS is a turn marker, not a document start: before plain code SmolLM2-135M reads
# best after its pretraining document separator (teacher-forced next-token accuracy on unseen
# third-party code 0.577 after <|endoftext|>, 0.570 after <|im_start|>, 0.569 after nothing).
CHAT_BOS = ("<|im_start|>",)
DOCUMENT_SEPARATOR = "<|endoftext|>"


def end_token_ids(tokenizer, generation_eos: int | Iterable[int] | None = None) -> set[int]:
    """Every id that ends a completion: the tokenizer's EOS, the model's generation_config
    eos ids, and the END_TOKEN_NAMES its vocabulary has."""
    ids = {getattr(tokenizer, "eos_token_id", None)}
    ids.update([generation_eos] if isinstance(generation_eos, int) or generation_eos is None
               else generation_eos)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[n] for n in END_TOKEN_NAMES if n in vocab)
    return {i for i in ids if isinstance(i, int)}


def document_start_id(tokenizer) -> int | None:
    """The id a prompt starts with: the BOS, unless the BOS is a chat turn marker and the
    vocabulary has a document separator (then that)."""
    if tokenizer is None:
        return None
    bos = getattr(tokenizer, "bos_token", None)
    vocab = tokenizer.get_vocab()
    if bos in CHAT_BOS and DOCUMENT_SEPARATOR in vocab:
        return vocab[DOCUMENT_SEPARATOR]
    return getattr(tokenizer, "bos_token_id", None)
