"""Settings: one dataclass with defaults, layered from CLI flags, initializationOptions and
workspace/didChangeConfiguration (later layers win, a layer only sets the keys it names).

Editors send camelCase (`maxTokens`), the CLI snake_case (`max_tokens`); both are accepted.
An invalid value never stops the server: it is reported (the caller shows the message) and that
one setting falls back to the layer below, so one typo does not discard the rest.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

# Settings that change which weights are loaded; any change among them triggers a reload.
MODEL_KEYS = ("preset", "draft", "target", "device", "dtype", "allow_download", "trust_remote_code",
              "remote", "remote_model", "api_key_env")

# Clients nest our settings under this section name (VS Code: "codespec.maxTokens").
SECTION = "codespec"


@dataclass(frozen=True)
class Settings:
    enable: bool = True
    preset: str | None = None
    draft: str | None = None
    target: str | None = None
    device: str = "auto"
    dtype: str | None = None
    allow_download: bool = False
    trust_remote_code: bool = False
    max_tokens: int = 48
    # Measured with `codespec-lsp bench server` (see README): below the usual gap between
    # keystrokes, so a pause is answered at once, yet long enough to skip bursts of fast typing.
    debounce_ms: int = 60
    # Prefix budget in tokens; None sizes it from the model's context window.
    context_tokens: int | None = None
    # Snippets from other open documents inside the prompt (the n-gram drafter reads them anyway).
    other_documents: bool = False
    # The confidence gate (postprocess): a suggested line whose tokens' geometric-mean target
    # probability is below this (0..1) is not shown. None: postprocess.DEFAULT_MIN_CONFIDENCE,
    # measured with `codespec-lsp bench quality`. Lower shows more (and worse) suggestions.
    min_confidence: float | None = None
    # An OpenAI-compatible server to complete with instead of the in-process engine (remote/).
    remote: str | None = None
    remote_model: str | None = None
    api_key_env: str | None = None   # the NAME of the variable holding the key, never the key
    # The server's log level; "debug" adds one line per request. None: info.
    log_level: str | None = None

    def model_key(self) -> tuple:
        return tuple(getattr(self, k) for k in MODEL_KEYS)


_FIELDS = {f.name: f for f in fields(Settings)}
_CHECKS: dict[str, tuple[type | tuple[type, ...], Any]] = {
    "enable": (bool, None),
    "preset": ((str, type(None)), None),
    "draft": ((str, type(None)), None),
    "target": ((str, type(None)), None),
    "device": (str, lambda v: v == "auto" or v == "cpu" or re.fullmatch(r"cuda(:\d+)?|mps", v)),
    "dtype": ((str, type(None)), lambda v: v in (None, "float16", "bfloat16", "float32")),
    "allow_download": (bool, None),
    "trust_remote_code": (bool, None),
    "max_tokens": (int, lambda v: 1 <= v <= 1024),
    "debounce_ms": (int, lambda v: 0 <= v <= 5000),
    "context_tokens": ((int, type(None)), lambda v: v is None or 16 <= v <= 1_000_000),
    "other_documents": (bool, None),
    "min_confidence": ((int, float, type(None)), lambda v: v is None or 0.0 <= v <= 1.0),
    "remote": ((str, type(None)), lambda v: v is None or re.match(r"https?://[^/\s]+", v)),
    "remote_model": ((str, type(None)), None),
    "log_level": ((str, type(None)), lambda v: v in (None, "debug", "info", "warning", "error")),
    "api_key_env": ((str, type(None)), lambda v: v is None or re.fullmatch(r"[A-Za-z_]\w*", v)),
}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower().replace("-", "_")


def _check(name: str, value: Any, shown: str) -> str | None:
    """`shown`: the key as the user spelled it, so the message names what they wrote."""
    types_, ok = _CHECKS[name]
    # bool is an int subclass: `maxTokens: true` must not pass as 1.
    if isinstance(value, bool) and types_ is int:
        return f"{shown}: expected an integer, got {value!r}"
    if not isinstance(value, types_):
        return f"{shown}: invalid value {value!r}"
    if ok is not None and not ok(value):
        return f"{shown}: value out of range: {value!r}"
    return None


def normalize(raw: Any) -> tuple[dict[str, Any], list[str], list[str]]:
    """Turn one client/CLI settings object into ({snake_name: value}, errors, unknown keys).

    Accepts the settings flat or nested under "codespec". Unknown keys are returned apart:
    clients often send other tools' sections too, which deserve a log line, not a pop-up.
    """
    errors: list[str] = []
    unknown: list[str] = []
    if raw is None:
        return {}, errors, unknown
    if not isinstance(raw, Mapping):
        return {}, [f"settings must be an object, got {type(raw).__name__}"], unknown
    if isinstance(raw.get(SECTION), Mapping):
        raw = raw[SECTION]
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = _snake(str(key))
        if name not in _FIELDS:
            unknown.append(str(key))
            continue
        if value is None and name in ("max_tokens", "debounce_ms", "device", "enable"):
            continue  # null means "not set here": the layer below decides
        if (err := _check(name, value, str(key))) is not None:
            errors.append(err)
            continue
        out[name] = value
    return out, errors, unknown


def from_cli(args: Any) -> dict[str, Any]:
    """The layer given on the command line (argparse namespace); unset flags are left out."""
    mapping = {
        "preset": "preset", "draft": "draft", "target": "target", "device": "device",
        "dtype": "dtype", "allow_download": "allow_download",
        "trust_remote_code": "trust_remote_code", "max_tokens": "max_tokens",
        "debounce_ms": "debounce_ms", "context_tokens": "context_tokens",
        "remote": "remote", "remote_model": "remote_model", "api_key_env": "api_key_env",
        "log_level": "log_level",
    }
    out = {}
    for name, attr in mapping.items():
        value = getattr(args, attr, None)
        # store_true flags are False when absent: only a set flag is a choice.
        if value is None or value is False:
            continue
        out[name] = value
    return out


@dataclass
class SettingsLayers:
    """Defaults < CLI < initializationOptions < didChangeConfiguration."""

    cli: dict[str, Any] = field(default_factory=dict)
    init: dict[str, Any] = field(default_factory=dict)
    workspace: dict[str, Any] = field(default_factory=dict)

    def effective(self) -> Settings:
        merged = {**self.cli, **self.init, **self.workspace}
        return dataclasses.replace(Settings(), **merged)

    def set_init(self, raw: Any) -> tuple[list[str], list[str]]:
        """Returns (errors, unknown keys)."""
        self.init, errors, unknown = normalize(raw)
        return errors, unknown

    def set_workspace(self, raw: Any) -> tuple[list[str], list[str]]:
        self.workspace, errors, unknown = normalize(raw)
        return errors, unknown


def default_context_tokens(context_window: int, max_tokens: int) -> int:
    """Prefix budget from the model's window: leave room for the answer and the FIM suffix.

    Capped because on a cache miss every prefix token is prefilled: past ~1.5k tokens the
    first keystroke after a file switch costs more latency than the extra context is worth.
    """
    room = max(context_window - max_tokens - 16, 64)
    return min(int(room * 0.75), 1536)
