"""Every transformers call the engine makes, in one place.

transformers 5.x moves fast (DynamicCache.crop now takes a negative count; `past_key_values` is
being renamed `cache`), so the rest of the engine talks to these few functions and only this
module changes when the pinned range in pyproject.toml moves.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import DynamicCache, PreTrainedModel


class ForwardCancelled(Exception):
    """Raised between two decoder layers of a forward pass whose request was cancelled."""


def use_length_agnostic_attention() -> None:
    """Keep PyTorch's attention off its cuDNN backend, process-wide.

    PyTorch (2.11, measured on an H200) prefers cuDNN attention for fp16/bf16 on Hopper, and cuDNN
    builds a plan for every new sequence length: 52-60 ms each time against 0.05 ms for the flash or
    memory-efficient kernels. Decoding grows the KV cache by one or more positions per forward, so
    nearly every forward met a new length: a first 150-token completion of the tiny pair took 7.6 s
    instead of 0.8 s. CPU attention never uses cuDNN, so this is a no-op there.
    """
    torch.backends.cuda.enable_cudnn_sdp(False)


def new_cache(model: PreTrainedModel) -> DynamicCache:
    return DynamicCache(config=model.config)


def cache_len(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def crop(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions. Rollback after a rejected draft is just this call."""
    extra = cache_len(cache) - length
    if extra > 0:
        cache.crop(-extra)


def copy_head(model: PreTrainedModel, cache: DynamicCache, length: int) -> DynamicCache:
    """A new cache holding copies of the first `length` positions of `cache`, and nothing more:
    a shared header is often a small part of a long donor, and copying all then cropping moved
    the whole donor's KV."""
    head = new_cache(model)
    for i, layer in enumerate(cache.layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor):
            head.update(keys[..., :length, :].clone(), values[..., :length, :].clone(), i)
    return head


def crop_layers(cache: DynamicCache, length: int) -> None:
    """Crop every layer on its own: after a forward stopped between layers, the layers that ran
    hold more positions than those that did not."""
    for layer in cache.layers:
        extra = layer.get_seq_length() - length
        if extra > 0:
            layer.crop(-extra)


def install_cancel_check(model: PreTrainedModel, should_stop: Callable[[], bool]) -> list:
    """Check `should_stop` before every decoder layer, so a cancel waits for one layer, not a
    whole forward. Returns the hook handles (the caller removes them when done); none for models
    whose layers are not at `model.model.layers`."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        return []

    def check(module, args):
        if should_stop():
            raise ForwardCancelled()

    return [layer.register_forward_pre_hook(check) for layer in layers]


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
    return forward_with_states(model, ids, cache, states=False)[0]


@torch.inference_mode()
def forward_with_states(model: PreTrainedModel, ids: list[int], cache: DynamicCache,
                        states: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """forward, and with `states` also the final hidden states [len(ids), H] the LM head reads
    (after the final norm): what an EAGLE draft head (engine/eagle.py) drafts from."""
    device = model.device
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    before = cache_len(cache)
    try:
        if not states:
            return model(input_ids=input_ids, past_key_values=cache, use_cache=True).logits[0].float(), None
        hidden = model.model(input_ids=input_ids, past_key_values=cache, use_cache=True).last_hidden_state
    except ForwardCancelled:
        crop_layers(cache, before)  # the cache is as if this forward never started
        raise
    return model.lm_head(hidden)[0].float(), hidden[0]


def prefill(model: PreTrainedModel, ids: list[int], cache: DynamicCache, chunk: int,
            cancelled=lambda: False) -> bool:
    """Run `ids` into `cache` in chunks, so a cancel waits for one chunk, never a whole prompt.
    Chunks already run stay in the cache, so a cancelled prefill is not wasted. False if cancelled."""
    for start in range(0, len(ids), chunk):
        if cancelled():
            return False
        try:
            forward(model, ids[start:start + chunk], cache)
        except ForwardCancelled:
            return False
    return True
