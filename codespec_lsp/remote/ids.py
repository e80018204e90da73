"""Text and ids for the remote backend: what is about the tokenizer, apart from the HTTP of serving.

Promises:
- With a local tokenizer (the target's folder), ids are the in-process engine's: BOS + ids.
- Without one, the server's /tokenize and /detokenize stand in, and the BOS the engine would add
  is found once (the server's own special tokens, else vLLM's /tokenizer_info).
- A text-only stream is re-tokenized here, holding back the last token until the text after it
  is known.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from codespec_lsp.engine.api import document_start_id, end_token_ids, fim_tokens_of, token_texts
from codespec_lsp.remote.client import ServerClient, ServerInfo, ServerProblem

if TYPE_CHECKING:
    from codespec_lsp.remote.backend import Health, LoopThread

log = logging.getLogger(__name__)


class _ServerDecoder:
    """Just enough of a tokenizer for complete.py's detokenizer, backed by the server."""

    all_special_ids: list[int] = []

    def __init__(self, ids: "RemoteIds") -> None:
        self._ids = ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        try:
            return self._ids.decode(ids)
        except (ServerProblem, concurrent.futures.TimeoutError) as problem:
            if isinstance(problem, ServerProblem):
                self._ids.health.failed(problem)
            return ""


class RemoteIds:
    """The remote backend's tokenizer side (see the module's promises). `probe()` asks the server
    what it serves, and loads the local tokenizer for it when none was given."""

    def __init__(self, client: ServerClient, loop: "LoopThread", health: "Health", tokenizer: Any = None,
                 tokenizer_loader: Callable[[ServerInfo], Any] | None = None) -> None:
        self.client, self.loop, self.health = client, loop, health
        self.local_tokenizer = tokenizer   # the HF tokenizer when one is at hand here
        self._tokenizer_loader = tokenizer_loader
        self._server_bos: int | None | bool = False   # False: not asked yet
        self._conventions: tuple[Any, frozenset[int], int | None] | None = None  # (tokenizer, ends, start)
        self.text_warning_given = False

    async def probe(self) -> ServerInfo:
        info = await self.client.probe()
        if self.local_tokenizer is None and self._tokenizer_loader is not None:
            loader, self._tokenizer_loader = self._tokenizer_loader, None
            self.local_tokenizer = await asyncio.to_thread(loader, info)
        return info

    @property
    def tokenizer(self) -> Any:
        """The local tokenizer, or one that decodes through the server's /detokenize (complete.py
        turns ids into text with `tokenizer.decode`)."""
        return self.local_tokenizer if self.local_tokenizer is not None else _ServerDecoder(self)

    @functools.cached_property
    def token_texts(self) -> list[str]:
        """Each id's text (api.token_texts; needs the local tokenizer, as healing does)."""
        return token_texts(self.local_tokenizer, len(self.local_tokenizer))

    @property
    def stop_ids(self) -> frozenset[int]:
        """Every end id the in-process engine stops at (api.end_token_ids), sent as vLLM's
        stop_token_ids: a server stopping at its EOS only would write past `<|endoftext|>`."""
        return self._local_conventions()[0]

    def _local_conventions(self) -> tuple[frozenset[int], int | None]:
        """(end ids, document-start id) of the local tokenizer. Read once per tokenizer: every
        streamed chunk is filtered by the end ids, and the vocabulary walk and the read of
        generation_config.json behind them cost far more than a chunk."""
        tok = self.local_tokenizer
        if tok is None:
            return frozenset(), None
        if self._conventions is None or self._conventions[0] is not tok:
            self._conventions = (tok, frozenset(end_token_ids(tok, _generation_eos(tok))),
                                 document_start_id(tok))
        return self._conventions[1], self._conventions[2]

    @property
    def fim_tokens(self) -> tuple[str, str, str] | None:
        return fim_tokens_of(self.local_tokenizer)

    def count_tokens(self, text: str) -> int:
        if self.local_tokenizer is not None:
            return len(self.local_tokenizer.encode(text, add_special_tokens=False, verbose=False))
        # No tokenizer here: a round trip per count would stall prompt building, so estimate
        # on the high side (code runs 3-4 characters a token) and let the prompt come out short.
        return -(-len(text) // 3)

    def encode(self, text: str) -> list[int]:
        """BOS + ids, as the in-process engine does; the server's /tokenize without a tokenizer."""
        if self.local_tokenizer is not None:
            ids = self.local_tokenizer.encode(text, add_special_tokens=False, verbose=False)
            bos = self._local_conventions()[1]  # the in-process engine's start too
        else:
            try:
                ids = self.loop.run(self._tokenize(text), timeout=self.client.deadline_s)
            except ServerProblem as problem:
                self.health.failed(problem)
                return []  # generate() answers an empty prompt with an empty generation
            bos = self._server_bos
        return ([bos] if bos is not None else []) + list(ids)

    async def _tokenize(self, text: str) -> list[int]:
        if self.client.info is None:
            await self.probe()
        if self._server_bos is False:
            self._server_bos = await self._find_server_bos()
        return await self.client.tokenize(text)

    async def _find_server_bos(self) -> int | None:
        """The BOS the in-process engine would add. The server's tokenizer adds it itself for some
        models; else vLLM's /tokenizer_info (--enable-tokenizer-info-endpoint) names it."""
        plain = await self.client.tokenize("x")
        special = await self.client.tokenize("x", add_special_tokens=True)
        if len(special) == len(plain) + 1 and special[1:] == plain:
            return special[0]
        info = await self.client._optional_json(f"{self.client.root}/tokenizer_info")
        bos = (info or {}).get("bos_token") if isinstance(info, dict) else None
        if isinstance(bos, dict):
            bos = bos.get("content")
        if isinstance(bos, str) and bos:
            ids = await self.client.tokenize(bos)
            if len(ids) == 1:
                return ids[0]
        log.warning("%s: no local tokenizer and the server does not say which BOS its model "
                    "expects: prompts go without one, so suggestions may differ from the "
                    "in-process engine's", self.client.base)
        return None

    def decode(self, ids: Sequence[int]) -> str:
        if self.local_tokenizer is not None:
            return self.local_tokenizer.decode(list(ids), skip_special_tokens=True)
        return self.loop.run(self.client.detokenize(list(ids)), timeout=self.client.deadline_s)

    def ids_for_text(self, before: str, delta: str, final: bool) -> list[int]:
        """For servers that stream text only: the ids of the new text, holding back the last
        token until the text after it is known (it may still merge with what follows)."""
        if not self.text_warning_given:
            self.text_warning_given = True
            log.warning("%s streams text, not token ids: re-tokenized here, so suggestions may "
                        "differ from the in-process engine's", self.client.base)
        if self.local_tokenizer is None:
            return []
        old = self.local_tokenizer.encode(before, add_special_tokens=False) if before else []
        new = self.local_tokenizer.encode(before + delta, add_special_tokens=False)
        stable_old = old if final and not before else old[:-1]
        stable_new = new if final else new[:-1]
        return stable_new[len(stable_old):] if new[:len(stable_old)] == stable_old else []


def _generation_eos(tokenizer: Any) -> Any:
    """generation_config.json's eos ids beside a local tokenizer (the target folder), if any."""
    import json
    from pathlib import Path
    path = Path(str(getattr(tokenizer, "name_or_path", "") or "")) / "generation_config.json"
    try:
        return json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    except (OSError, ValueError):
        return None
