"""Speculative decoding engine: load a draft/target pair, generate with KV prefix reuse and cancel.

Public surface (everything else in this package is an implementation detail):

    engine = load_engine(preset="tiny")             # or draft=..., target=..., device=..., dtype=...
    gen = engine.generate(engine.encode(text), max_new_tokens=64, cancel=token, key=uri)
    for token_id in gen: ...                        # the caller decides when to stop: gen.close()
    gen.result.tokens, .cancelled, .target_forwards, ...   # see api.GenerationResult
(complete.py turns ids into text: incremental detokenizing, stop strings, token healing.)

Modules: api (the contract), engine (the loop), speculative (one step and its maths), speedup
(the speedup model and best K, which the planner applies too), pairing (the draft/target rule),
kvcache (the KV class, one prefix-cache entry per document), drafters, adaptive (K), copy_prior,
hf (every transformers call), models (loading).

Engine attributes used by the server and planner:
    engine.tokenizer          the shared HF tokenizer (draft and target were checked to agree)
    engine.count_tokens(text) -> int
    engine.context_window     target's max positions
    engine.fim_tokens         (pre, suf, mid) strings when the target infills, else None
    engine.preset, engine.draft_name, engine.target_name, engine.device (str)
    engine.draft_model, engine.target_model   (transformers modules; draft may be None)
"""

from codespec_lsp.engine.api import (  # noqa: F401
    CancelToken,
    GenerationResult,
    MissingExtraError,
    ModelLoadError,
    TokenizerMismatchError,
)


def __getattr__(name: str):
    # Lazy: importing transformers takes seconds, and the protocol layer only needs api types.
    if name in ("load_engine", "PRESETS", "default_preset"):
        from codespec_lsp.engine import models
        return getattr(models, name)
    if name == "Engine":
        from codespec_lsp.engine.engine import Engine
        return Engine
    raise AttributeError(name)
