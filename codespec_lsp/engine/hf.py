"""Every transformers call the engine makes, in one place.

transformers 5.x moves fast (DynamicCache.crop now takes a negative count; `past_key_values` is
being renamed `cache`), so the rest of the engine talks to these few functions and only this
module changes when the pinned range in pyproject.toml moves.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask


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


CPU_ATTENTION = "codespec_cpu_sdpa"


def _cpu_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
              **kwargs):
    """transformers' sdpa, except for several query rows under a mask on the CPU (a verify forward,
    a prefill chunk after a cached prefix): there transformers copies every cached key and value
    once per query head sharing it (repeat_kv; SmolLM2 has 3 query heads a KV head) before calling
    SDPA, a copy of the whole cache in every layer that cost a 4-token verify as much as its matrix
    products. PyTorch's CPU flash kernel takes the grouped heads and a boolean mask itself."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (query.device.type == "cpu" and groups > 1 and query.shape[2] > 1 and dropout == 0.0
            and attention_mask is not None and attention_mask.dtype == torch.bool
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None):
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                             scale=scaling, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, is_causal=is_causal, **kwargs)


AttentionInterface.register(CPU_ATTENTION, _cpu_sdpa)
AttentionMaskInterface.register(CPU_ATTENTION, sdpa_mask)  # the masks sdpa gets, unchanged


def use_cpu_attention(model: PreTrainedModel) -> None:
    """Attention for a model on the CPU (_cpu_sdpa); models that take no custom attention keep theirs."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(CPU_ATTENTION)


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of buffers with spare room. transformers'
    layer concatenates, copying the whole cache in every layer at every forward: on smol at 1,500
    cached tokens, 69 MB a forward, an eighth of the bytes its weights take to read. Here a
    forward writes its new positions in place; crop (inherited) shortens the views, and the next
    forward overwrites what was cut. Nothing else holds a view: a KV owns its cache, and a copy
    (copy_head) goes through `update` into buffers of its own."""

    buffers: tuple[torch.Tensor, torch.Tensor] | None = None  # (keys, values) with the spare room

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        held = self.get_seq_length()
        end = held + key_states.shape[-2]
        if self.buffers is None or self.buffers[0].shape[-2] < end:
            room = max(end, held * 3 // 2)  # exact when filled at once; else a few copies a prompt
            grown = []
            for old, new in ((self.keys, key_states), (self.values, value_states)):
                buffer = new.new_empty((*new.shape[:-2], room, new.shape[-1]))
                if held:
                    buffer[..., :held, :] = old
                grown.append(buffer)
            self.buffers = tuple(grown)
        keys, values = self.buffers
        keys[..., held:end, :] = key_states
        values[..., held:end, :] = value_states
        self.keys, self.values = keys[..., :end, :], values[..., :end, :]
        return self.keys, self.values

    def reset(self) -> None:
        self.buffers = None
        super().reset()


def new_cache(model: PreTrainedModel) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    if model.device.type == "cpu":  # measured there; on a GPU the strided views are unmeasured yet
        cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


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
            head.update(keys[..., :length, :], values[..., :length, :], i)  # update copies
    return head


@torch.inference_mode()
def keep_rows(cache: DynamicCache, start: int, rows: list[int]) -> None:
    """Keep the first `start` positions, then the positions `rows` (each past `start`), in order:
    the accepted branch of a token tree moved down to follow the prefix."""
    for layer in cache.layers:
        index = torch.tensor(rows, device=layer.keys.device)
        for held in (layer.keys, layer.values):
            held[..., start:start + len(rows), :] = held.index_select(-2, index)
    crop(cache, start + len(rows))


def takes_trees(model: PreTrainedModel) -> bool:
    """Whether the model's attention reads a custom boolean 4D mask (tree_inputs): SDPA does;
    eager attention adds the mask as floats, and flash kernels take none."""
    return getattr(model.config, "_attn_implementation", None) in ("sdpa", CPU_ATTENTION)


def tree_inputs(held: int, fed: int, parents: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention mask [1, 1, fed, held + fed], True where a row may look; position ids [1, fed])
    for `fed` ids after `held` cached ones, the last len(parents) of them a token tree: a node
    sees the cache, the chain before the tree and its own ancestors, at position = its depth."""
    chain = fed - len(parents)
    mask = torch.ones(fed, held + fed, dtype=torch.bool, device=device).tril(held)
    depth = list(range(held, held + chain))
    for i, parent in enumerate(parents):
        row = chain + i
        mask[row, held + chain:] = False
        if parent >= 0:
            mask[row, held + chain:held + row] = mask[chain + parent, held + chain:held + row]
        mask[row, held + row] = True
        depth.append((depth[chain + parent] if parent >= 0 else held + chain - 1) + 1)
    return mask[None, None], torch.tensor([depth], device=device)


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
        held = getattr(layer, "buffers", None) or (getattr(layer, "keys", None), getattr(layer, "values", None))
        for t in held:
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


@torch.inference_mode()
def forward(model: PreTrainedModel, ids: list[int], cache: DynamicCache, last_only: bool = False,
            tree: list[int] | None = None) -> torch.Tensor:
    """Run `ids` after what `cache` holds; the cache grows by len(ids). Returns fp32 logits
    [len(ids), V], or [1, V] for the last id only with `last_only` (a prefill chunk, whose logits
    nobody reads: on smol the LM head is a fifth of the weights, a tenth of a chunk's work)."""
    return forward_with_states(model, ids, cache, states=False, last_only=last_only, tree=tree)[0]


@torch.inference_mode()
def forward_with_states(model: PreTrainedModel, ids: list[int], cache: DynamicCache,
                        states: bool = True, last_only: bool = False,
                        tree: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """forward, and with `states` also the final hidden states [len(ids), H] the LM head reads
    (after the final norm): what an EAGLE draft head (engine/eagle.py) drafts from. `tree`: the
    parents of the last ids, a token tree (tree_inputs)."""
    device = model.device
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    before = cache_len(cache)
    extra = {}
    if tree is not None:
        mask, positions = tree_inputs(before, len(ids), tree, device)
        extra = {"attention_mask": mask, "position_ids": positions}
    try:
        if not states:
            out = model(input_ids=input_ids, past_key_values=cache, use_cache=True,
                        logits_to_keep=1 if last_only else 0, **extra)  # 0: every row
            return out.logits[0].float(), None
        hidden = model.model(input_ids=input_ids, past_key_values=cache, use_cache=True, **extra).last_hidden_state
    except ForwardCancelled:
        crop_layers(cache, before)  # the cache is as if this forward never started
        raise
    return model.lm_head(hidden[:, -1:] if last_only else hidden)[0].float(), hidden[0]


def prefill(model: PreTrainedModel, ids: list[int], cache: DynamicCache, chunk: int,
            cancelled=lambda: False) -> bool:
    """Run `ids` into `cache` in chunks, so a cancel waits for one chunk, never a whole prompt.
    Chunks already run stay in the cache, so a cancelled prefill is not wasted. False if cancelled."""
    for start in range(0, len(ids), chunk):
        if cancelled():
            return False
        try:
            forward(model, ids[start:start + chunk], cache, last_only=True)
        except ForwardCancelled:
            return False
    return True
