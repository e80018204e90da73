"""Settings: one typed dataclass with defaults, layered from CLI flags, initializationOptions and
workspace/didChangeConfiguration (later layers win, a layer only sets the keys it names).

The field types are the schema (jedi-language-server's pattern): a cattrs converter structures
each value into its field's annotated type, and the camelCase key an editor sends (`maxTokens`)
is derived from the field name, so a new setting is one annotated line here. Only the checks a
type cannot say (ranges, URL, device names) are written out, next to the field.
The CLI spells keys snake_case (`max_tokens`); both are accepted.
An invalid value never stops the server: it is reported (the caller shows the message, naming
the key as the user wrote it and what is expected) and that one setting falls back to the layer
below, so one typo does not discard the rest.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Literal, Mapping

import cattrs

# Settings that change which weights are loaded; any change among them triggers a reload.
MODEL_KEYS = ("preset", "draft", "target", "device", "dtype", "allow_download", "trust_remote_code",
              "remote", "remote_model", "api_key_env")

LOG_LEVELS = ("debug", "info", "warning", "error")

# Clients nest our settings under this section name (VS Code: "codespec.maxTokens").
SECTION = "codespec"


def _rule(check: Callable[[Any], Any], expected: str) -> dict:
    """Field metadata: what a type cannot say. `expected` ends the message on a bad value."""
    return {"check": check, "expected": expected}


@dataclass(frozen=True)
class Settings:
    enable: bool = True
    preset: str | None = None
    draft: str | None = None
    target: str | None = None
    device: str = field(default="auto", metadata=_rule(
        lambda v: v in ("auto", "cpu", "mps") or re.fullmatch(r"cuda(:\d+)?", v),
        "auto, cpu, mps, cuda or cuda:N"))
    dtype: Literal["float16", "bfloat16", "float32"] | None = None
    allow_download: bool = False
    trust_remote_code: bool = False
    max_tokens: int = field(default=48, metadata=_rule(lambda v: 1 <= v <= 1024, "1 to 1024"))
    # Measured with `codespec-lsp bench server` (see README): below the usual gap between
    # keystrokes, so a pause is answered at once, yet long enough to skip bursts of fast typing.
    debounce_ms: int = field(default=60, metadata=_rule(lambda v: 0 <= v <= 5000, "0 to 5000"))
    # Keystroke to suggestion, at most (about): once this much has passed since the keystroke,
    # what the model has written so far (whole words) is shown at once and the generation goes
    # on; its rest answers the next keystroke that types into it (typing-through). 0: wait for
    # the whole suggestion. Measured with `codespec-lsp bench server --pause-ms` (README).
    time_budget_ms: int = field(default=200, metadata=_rule(lambda v: 0 <= v <= 60000, "0 to 60000"))
    # Prefix budget in tokens; None sizes it from the model's context window.
    context_tokens: int | None = field(default=None, metadata=_rule(
        lambda v: 16 <= v <= 1_000_000, "16 to 1000000"))
    # The definitions of the names a file imports from other files of the workspace (open
    # documents, then files under the workspace folders) before the file in the prompt
    # (completion/workspace.py). On: with SmolLM2-135M, `codespec-lsp bench context` measured it
    # at or above off on every figure on three packages written after the model, at no keystroke
    # cost (docs/context.md); a file that imports nothing from the workspace gets the same prompt.
    workspace_context: bool = True
    # The confidence gate (postprocess): a suggested line whose tokens' geometric-mean target
    # probability is below this (0..1) is not shown. None: postprocess.DEFAULT_MIN_CONFIDENCE,
    # measured with `codespec-lsp bench quality`. Lower shows more (and worse) suggestions.
    min_confidence: float | None = field(default=None, metadata=_rule(
        lambda v: 0.0 <= v <= 1.0, "a probability from 0 to 1"))
    # The copy prior (engine/copy_prior.py): how much of "what followed these tokens earlier in
    # the context" is mixed into the model's next-token distribution (0..1; 0: the model alone).
    # None: the measured default, COPY_WEIGHT. The in-process engine only.
    copy_weight: float | None = field(default=None, metadata=_rule(
        lambda v: 0.0 <= v <= 1.0, "a number from 0 to 1"))
    # Token healing's lean to the document's names (completion/heal.py): the logit a token loses
    # when it makes the half-typed word none of the names the file uses (0: no lean). None: the
    # measured default, WORD_BIAS. The in-process engine only.
    word_bias: float | None = field(default=None, metadata=_rule(
        lambda v: 0.0 <= v <= 100.0, "a number from 0 to 100"))
    # Exactly the target's output: no copy prior, no name lean, whatever the model's measured
    # knobs (engine/scoring.py). Token healing and the post-processing gates still apply: they
    # decide what is asked and what is shown, not which tokens the target picks.
    exact: bool = False
    # An OpenAI-compatible server to complete with instead of the in-process engine (remote/).
    remote: str | None = field(default=None, metadata=_rule(
        lambda v: re.match(r"https?://[^/\s]+", v), "an http:// or https:// URL"))
    remote_model: str | None = None
    api_key_env: str | None = field(default=None, metadata=_rule(  # the variable's NAME, not the key
        lambda v: re.fullmatch(r"[A-Za-z_]\w*", v), "an environment variable name"))
    # The server's log level; "debug" adds one line per request. None: info.
    log_level: Literal["debug", "info", "warning", "error"] | None = None

    def model_key(self) -> tuple:
        return tuple(getattr(self, k) for k in MODEL_KEYS)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


_TYPES = typing.get_type_hints(Settings)
_FIELDS = {f.name: f for f in fields(Settings)}
# Both spellings of each key: camelCase from editors, snake_case from the CLI and old configs.
_KEYS = {**{_camel(n): n for n in _FIELDS}, **{n: n for n in _FIELDS},
         # The old name of workspaceContext (its other-document windows measured worse than none).
         "otherDocuments": "workspace_context", "other_documents": "workspace_context"}


def _strict(kind: type, accepts: tuple[type, ...]) -> Callable[[Any, type], Any]:
    """cattrs converts by default ("5" -> 5, 1 -> True): a settings file with `"maxTokens": "5"`
    or `"enable": 1` is a mistake worth naming, not guessing at."""
    def structure(value: Any, _: type) -> Any:
        # bool is an int subclass: `maxTokens: true` must not pass as 1.
        if isinstance(value, bool) and kind is not bool or not isinstance(value, accepts):
            raise TypeError(f"expected {kind.__name__}")
        return kind(value)
    return structure


_converter = cattrs.Converter()
for _kind, _accepts in ((bool, (bool,)), (int, (int,)), (float, (int, float)), (str, (str,))):
    _converter.register_structure_hook(_kind, _strict(_kind, _accepts))


def _expected(name: str) -> str:
    if (rule := _FIELDS[name].metadata.get("expected")) is not None:
        return rule
    args = [a for a in typing.get_args(_TYPES[name]) if a is not type(None)]
    literal = [v for a in args if typing.get_origin(a) is Literal for v in typing.get_args(a)]
    if literal:
        return ", ".join(map(str, literal))
    kind = args[0] if args else _TYPES[name]
    return {bool: "true or false", int: "an integer", float: "a number",
            str: "a string"}.get(kind, str(kind))


def _structure(name: str, value: Any, shown: str) -> tuple[Any, str | None]:
    """(value in the field's type, None) or (None, the message). `shown`: the key as the user
    spelled it, so the message names what they wrote."""
    try:
        value = _converter.structure(value, _TYPES[name])
        check = _FIELDS[name].metadata.get("check")
        if value is None or check is None or check(value):
            return value, None
    except Exception:
        pass
    return None, f"{shown}: invalid value {value!r} (expected {_expected(name)})"


def _nullable(name: str) -> bool:
    return type(None) in typing.get_args(_TYPES[name])


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
        name = _KEYS.get(str(key))
        if name is None:
            unknown.append(str(key))
            continue
        if value is None and not _nullable(name):
            continue  # null means "not set here": the layer below decides
        value, err = _structure(name, value, str(key))
        if err is not None:
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
        "time_budget_ms": "time_budget_ms", "remote": "remote", "remote_model": "remote_model", "api_key_env": "api_key_env",
        "log_level": "log_level", "exact": "exact",
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
