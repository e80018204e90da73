"""Completions from a remote OpenAI-compatible server (vLLM first; llama-server, SGLang).

Public surface:

    backend = connect_remote("http://127.0.0.1:8000/v1", model=None, api_key_env="VLLM_KEY",
                             tokenizer="path/or/preset-target", notify=show_message)
    gen = backend.generate(backend.encode(prompt), max_new_tokens=48, cancel=token, key=uri)
    for tok in gen: ...; gen.close(); gen.result          # the seam's Backend (SEAM.md)
    backend.server_stats()   # {"backend", "server_acceptance_rate", "server_prefix_cache_hit_rate"}

No remote unless configured; the API key is read from the environment variable the user names,
never from settings, and is never logged. Modules: client.py (HTTP), backend.py (the seam),
ids.py (text and ids: local tokenizer or the server's), metrics.py (Prometheus text -> rates).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable

from codespec_lsp.engine.api import ModelLoadError
from codespec_lsp.remote.backend import Notify, RemoteBackend, RemoteGeneration, _log_notify
from codespec_lsp.remote.client import (CONNECT_TIMEOUT_S, DEADLINE_S, READ_TIMEOUT_S,  # noqa: F401
                                        ServerClient, ServerInfo, ServerProblem, is_loopback,
                                        normalize_url)

__all__ = ["connect_remote", "backend_from_settings", "RemoteBackend", "RemoteGeneration", "ServerProblem", "api_key_from_env"]

log = logging.getLogger(__name__)


def api_key_from_env(var: str | None) -> str | None:
    """The key from the variable the user named; a named but unset variable is a setup error."""
    if not var:
        return None
    key = os.environ.get(var, "")
    if not key:
        raise ModelLoadError(f"apiKeyEnv names {var}, but {var} is not set in the language "
                             f"server's environment")
    return key


def _tokenizer_from(ref: str | None) -> Any:
    """A local tokenizer folder, or None. Offline only: no hub download for a remote set-up."""
    if not ref:
        return None
    path = Path(ref).expanduser()
    if not (path / "tokenizer_config.json").is_file() and not (path / "tokenizer.json").is_file():
        return None
    from codespec_lsp.engine.models import load_tokenizer
    try:
        return load_tokenizer(str(path))
    except ModelLoadError as exc:
        log.warning("tokenizer at %s not usable: %s", path, exc)
        return None


def _server_side_tokenizer(info: ServerInfo) -> Any:
    """The server's model folder when it is on this machine (vLLM reports it as `root`)."""
    for ref in (info.root, info.model):
        if (tok := _tokenizer_from(ref)) is not None:
            log.info("tokenizer for %s from %s", info.model, ref)
            return tok
    log.warning("no tokenizer for %s on this machine: prompts go through the server's /tokenize",
                info.model)
    return None


def connect_remote(url: str, model: str | None = None, api_key_env: str | None = None, *,
                   tokenizer: Any = None, notify: Notify | None = _log_notify,
                   probe: bool = True, backoff_s: tuple[float, float] = (0.5, 8.0),
                   **client_options: Any) -> RemoteBackend:
    """A RemoteBackend for `url` (the OpenAI-compatible base). Raises ModelLoadError only for set-up
    mistakes (a bad URL, an unset key variable); a server that is down is reported through
    `notify` (None: held until `backend.health.set_notify`) and retried by itself. `tokenizer`: a local folder with the target's tokenizer
    (the preset's or settings' target), or a tokenizer object; without it the server's model folder is tried when it is
    on this machine, then the server's /tokenize."""
    # httpx logs every request at INFO: one line per keystroke in the editor's log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        client = ServerClient(url, model, api_key_from_env(api_key_env), **client_options)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    local_tok = _tokenizer_from(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer
    backend = RemoteBackend(client, local_tok, notify=notify, backoff_s=backoff_s,
                            tokenizer_loader=None if local_tok is not None else _server_side_tokenizer)
    if api_key_env and not is_loopback(client.base) and client.base.startswith("http:"):
        backend.health._tell("error", f"codespec: the API key goes to {client.base} unencrypted; "
                                      f"use https://")
    if probe:
        try:
            backend.loop.run(backend.ids.probe(), timeout=client.deadline_s)
        except ServerProblem as problem:
            backend.health.failed(problem)  # told once; the first request probes again
    return backend


def backend_from_settings(settings: Any, notify: Notify | None = None) -> RemoteBackend:
    """The remote backend for Settings with `remote` set (engine_host's loader). The tokenizer:
    the `target` folder when given, else the preset's target folder, else the server's own."""
    tokenizer = settings.target
    if tokenizer is None and settings.preset:
        from codespec_lsp.engine.models import PRESETS
        preset = PRESETS.get(settings.preset)
        tokenizer = preset.target if preset is not None else None
    return connect_remote(settings.remote, settings.remote_model, settings.api_key_env,
                          tokenizer=tokenizer, notify=notify)
