"""Every transformers call the engine makes, in one place.

transformers 5.x moves fast (DynamicCache.crop now takes a negative count; `past_key_values` is
being renamed `cache`), so the rest of the engine talks to these few functions and only this
module changes when the pinned range in pyproject.toml moves.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel


def new_cache(model: PreTrainedModel) -> DynamicCache:
    return DynamicCache(config=model.config)


def cache_len(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def crop(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions. Rollback after a rejected draft is just this call."""
    extra = cache_len(cache) - length
    if extra > 0:
        cache.crop(-extra)


def cache_nbytes(cache: DynamicCache) -> int:
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


@torch.inference_mode()
def forward(model: PreTrainedModel, ids: list[int], cache: DynamicCache) -> torch.Tensor:
    """Run `ids` after what `cache` holds; the cache grows by len(ids). Returns fp32 logits [len(ids), V]."""
    device = model.device
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    out = model(input_ids=input_ids, past_key_values=cache, use_cache=True)
    return out.logits[0].float()


def prefill(model: PreTrainedModel, ids: list[int], cache: DynamicCache, chunk: int,
            cancelled=lambda: False) -> bool:
    """Run `ids` into `cache` in chunks, so a cancel waits for one chunk, never a whole prompt.
    Chunks already run stay in the cache, so a cancelled prefill is not wasted. False if cancelled."""
    for start in range(0, len(ids), chunk):
        if cancelled():
            return False
        forward(model, ids[start:start + chunk], cache)
    return True
