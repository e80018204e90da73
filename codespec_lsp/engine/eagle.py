"""A feature-level draft for one target (EAGLE, Li et al. 2024): one decoder layer that reads the
target's final hidden state at position j-1 and the token at j, and predicts the target's hidden
state at j; the target's own LM head (cut to the ids it predicts most) turns that into a token.

Why this form for a small target on a CPU (docs/draft.md): a separate small model starts from
nothing and must relearn the target, while the target's last hidden state already decides its
next token, so one layer predicting the next one agrees with it far more often for the same cost.
The head's cost is one layer of the target's width plus a cut LM head: about a tenth of a target
forward.

Layout of the head's own cache: entry j (for j >= 1) is computed from (token j, the target's hidden
state at j-1). Entries from the target's real states are kept across steps; entries computed from
the head's own predictions while drafting are dropped at the next propose, where the target's real
states for the accepted tokens replace them (riding in the first draft forward).

Files (`save_head`): config.json (the layer's LlamaConfig plus `eagle`: the target it was
trained for), model.safetensors (fc, the layer, its norm, head_ids). The embedding and the LM head
are the target's, bound at load: the head only works with the target it was trained on, and
`load_head` refuses another (by its config's shape and vocabulary).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from cachetools import LRUCache
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import DynamicCache, LlamaConfig, LlamaModel

from codespec_lsp.engine import hf, pairing
from codespec_lsp.engine.api import CancelToken, ModelLoadError, cancel_check
from codespec_lsp.engine.drafters import Proposal, Sampling
from codespec_lsp.engine.kvcache import KV, common_prefix_len
from codespec_lsp.engine.speculative import adjust_probs, sample

CATCH_UP_CHUNK = 256  # rows per catch-up forward when a whole new prompt arrives (cancellable)
# Greedy: the head's second choice for the first token rides in the step's token tree as a
# one-token branch (EAGLE-2's trees, cut to one extra row). At steps where no branch kept a token,
# it was the target's token 12 times in 68 (benchmarks/unseen_tune, 8 points; docs/draft.md).
RUNNERS_UP = 1


class EagleHead(nn.Module):
    def __init__(self, config: LlamaConfig, head_ids: torch.Tensor, embed: nn.Embedding,
                 head_weight: torch.Tensor, target_identity: dict) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.config, self.target_identity = config, target_identity
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.body = LlamaModel(config)  # vocab_size 1: its embedding is unused (inputs_embeds)
        self.register_buffer("head_ids", head_ids.long(), persistent=True)
        # The target's, frozen and not saved: bound at load (module docstring).
        self.embed = embed
        self.register_buffer("head_weight", head_weight.detach(), persistent=False)

    @classmethod
    def for_target(cls, target, head_ids: torch.Tensor) -> "EagleHead":
        """A fresh head for `target` (a LlamaForCausalLM), its norm started from the target's."""
        config = layer_config(target.config)
        head = cls(config, head_ids, _frozen_embedding(target), target.lm_head.weight[head_ids],
                   _identity(target.config))
        head.body.norm.weight.data.copy_(target.model.norm.weight.data)
        return head

    def forward(self, ids: torch.Tensor, features: torch.Tensor,
                cache: DynamicCache | None = None) -> torch.Tensor:
        """ids [B, T] (tokens j), features [B, T, H] (the target's states at j-1) -> predicted
        states at j [B, T, H]."""
        x = self.fc(torch.cat([self.embed(ids).to(features.dtype), features], dim=-1))
        out = self.body(inputs_embeds=x, past_key_values=cache, use_cache=cache is not None)
        return out.last_hidden_state

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """Scores over head_ids only [..., N]."""
        return states @ self.head_weight.T

    def position_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> their index in head_ids; -100 for ids the head cannot propose."""
        where = torch.full((self.embed.num_embeddings,), -100, dtype=torch.long, device=ids.device)
        where[self.head_ids] = torch.arange(len(self.head_ids), device=ids.device)
        return where[ids]


def layer_config(target_config) -> LlamaConfig:
    """One decoder layer of the target's shape, with a one-row (unused) vocabulary."""
    fields = {k: getattr(target_config, k) for k in (
        "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
        "head_dim", "hidden_act", "rms_norm_eps", "max_position_embeddings", "rope_parameters",
        "attention_bias", "mlp_bias") if hasattr(target_config, k)}
    return LlamaConfig(**fields, num_hidden_layers=1, vocab_size=1, tie_word_embeddings=False,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _frozen_embedding(target) -> nn.Embedding:
    embed = target.get_input_embeddings()
    return nn.Embedding.from_pretrained(embed.weight.detach(), freeze=True)


def _identity(target_config) -> dict:
    return pairing.eagle_identity(target_config.to_dict())


def save_head(head: EagleHead, folder: Path, target_folder: Path | str | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    config = head.config.to_dict()
    config["eagle"] = {"target": head.target_identity,
                       "trained_for": str(Path(target_folder).name) if target_folder else None}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in head.state_dict().items()
             if not k.startswith("embed.") and k != "head_ids" and not k.startswith("body.embed_tokens")}
    state["head_ids"] = head.head_ids.to(torch.int32)
    save_file(state, str(folder / "model.safetensors"))


def is_eagle_folder(folder: str | Path) -> bool:
    path = Path(folder) / "config.json"
    try:
        return "eagle" in json.loads(path.read_text())
    except (OSError, ValueError):
        return False


def load_head(folder: str | Path, target) -> EagleHead:
    """The head in `folder`, bound to `target`'s embedding and LM head, in the target's dtype."""
    folder = Path(folder)
    try:
        raw = json.loads((folder / "config.json").read_text())
        state = load_file(str(folder / "model.safetensors"))
    except Exception as exc:  # OSError, json's ValueError, safetensors' SafetensorError
        raise ModelLoadError(f"cannot load the EAGLE draft head from {folder}: {exc}") from None
    check = pairing.compare_eagle(raw, target.config.to_dict())
    if not check.compatible:
        raise ModelLoadError(f"cannot use the EAGLE draft head in {folder}: {check.reason}")
    have = _identity(target.config)
    raw.pop("eagle")
    config = LlamaConfig(**{k: v for k, v in raw.items() if k in LlamaConfig().to_dict() or k == "head_dim"})
    head_ids = state.pop("head_ids").long()
    head = EagleHead(config, head_ids, _frozen_embedding(target), target.lm_head.weight[head_ids], have)
    dtype = next(target.parameters()).dtype
    missing, unexpected = head.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    missing = [k for k in missing if not k.startswith(("embed.", "body.embed_tokens")) and k != "head_ids"]
    if missing or unexpected:
        raise ModelLoadError(f"the EAGLE draft head in {folder} does not match its config "
                             f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    if target.device.type == "cpu":
        hf.use_cpu_attention(head.body)  # its catch-up forwards are masked multi-row ones
    return head.to(device=target.device, dtype=dtype).eval()


class EagleDrafter:
    """Drafts from the target's hidden states (module docstring). `begin` gets the target's KV,
    whose `hidden` rows are the states this head reads."""

    name = "eagle"

    def __init__(self, head: EagleHead, vocab_size: int, keep: int = 16) -> None:
        self.head, self.vocab_size = head, vocab_size
        self.forwards = 0
        self.cache_enabled = True
        self.target = None
        # per document: (tokens of the entries, cache) holding entries from real states only
        self._saved: LRUCache = LRUCache(maxsize=keep)
        self.ids: list[int] = []  # the token each cache entry was computed for: tokens[1:1 + n]
        self.real = 0             # leading entries computed from the target's real states
        self.cache = hf.new_cache(head.body)

    def begin(self, key: str | None, prompt: list[int], lookup: list[int],
              opening: list[int] = (), target: KV | None = None) -> None:
        self.target = target
        saved = self._saved.pop(key, None) if self.cache_enabled else None
        if saved is None:
            self.ids, self.cache = [], hf.new_cache(self.head.body)
        else:
            self.ids, self.cache = saved
        self.real = len(self.ids)

    def clear(self) -> None:
        self._saved.clear()

    def enable_cache(self, enabled: bool) -> None:
        self.cache_enabled = enabled
        self.clear()

    def _crop(self, n: int) -> None:
        hf.crop(self.cache, n)
        del self.ids[n:]
        self.real = min(self.real, n)

    def _real_rows(self, tokens: list[int]) -> int:
        """Entries the target's real states cover. At a request's first step the target still
        lacks the last few prompt tokens (engine.FIRST_STEP_PROMPT: they ride in this step's
        verify): the head reads its own states past them, as it does for its drafts."""
        target = self.target
        if target is None or target.hidden is None:
            return 0
        return min(len(tokens) - 1, len(target))

    @torch.inference_mode()
    def catch_up(self, tokens: list[int], cancel: CancelToken | None = None) -> torch.Tensor | None:
        """Bring the head's cache up to the target's real states for `tokens`, in cancellable
        chunks; returns the last real entry's output state (None: no state yet, or cancelled).
        The engine calls it after a prefill too, so a new prompt's catch-up is prefill work, not
        the first draft's: counted as drafting, it made the head look too dear to draft with."""
        have = self._real_rows(tokens)
        if have < 1:
            return None
        # keep the real entries whose tokens still match, short of the last real one: its state drafts
        self._crop(min(self.real, common_prefix_len(self.ids, tokens[1:]), have - 1))
        start, states = len(self.ids), None
        device, dtype = self.target.hidden.device, self.target.hidden.dtype
        while start < have:
            if cancel is not None and cancel.cancelled:
                return None
            stop = min(start + CATCH_UP_CHUNK, have)
            ids = torch.tensor([tokens[start + 1:stop + 1]], device=device)
            states = self.head(ids, self.target.hidden[start:stop].unsqueeze(0).to(dtype), self.cache)
            self.ids.extend(tokens[start + 1:stop + 1])
            self.real = len(self.ids)
            self.forwards += 1
            start = stop
        return states[0, -1]

    @torch.inference_mode()
    def propose(self, tokens: list[int], k: int, sampling: Sampling | None = None,
                cancel: CancelToken | None = None) -> Proposal:
        have = self._real_rows(tokens)
        state = self.catch_up(tokens, cancel) if k > 0 else None
        if state is None:
            return Proposal([], None)  # nothing the head could read yet, or cancelled
        is_cancelled = cancel_check(cancel)
        for token in tokens[have + 1:]:  # the prompt's tail the target has not run yet
            state = self._advance(token, state)
        drafted, probs, runners_up = [], [], []
        for i in range(k):
            logits = self.head.logits(state).float()
            if sampling is None:
                best = self.head.head_ids[logits.topk(1 + (RUNNERS_UP if i == 0 else 0)).indices].tolist()
                token = best[0]
                if i == 0:
                    runners_up = best[1:]
            else:
                q_cut = adjust_probs(logits, sampling.temperature, sampling.top_p)
                q = torch.zeros(self.vocab_size, dtype=q_cut.dtype, device=q_cut.device)
                q[self.head.head_ids] = q_cut
                token = sample(q, sampling.generator)
                probs.append(q)
            drafted.append(token)
            if i + 1 == k or is_cancelled():
                break
            state = self._advance(token, state)
        return Proposal(drafted, torch.stack(probs) if probs else None, runners_up)

    def _advance(self, token: int, state: torch.Tensor) -> torch.Tensor:
        """One entry from the head's own predicted state (not kept past the next propose)."""
        ids = torch.tensor([[token]], device=state.device)
        self.ids.append(token)
        self.forwards += 1
        return self.head(ids, state.view(1, 1, -1), self.cache)[0, -1]

    def rollback(self, n: int) -> None:
        pass  # drafted entries are dropped at the next propose, where real states replace them

    def end(self, key: str | None, tokens: list[int] | None) -> None:
        if tokens is not None:
            self._crop(min(self.real, common_prefix_len(self.ids, tokens[1:])))
            if self.ids and self.cache_enabled:
                self._saved[key] = (self.ids, self.cache)
        self.ids, self.cache, self.real, self.target = [], hf.new_cache(self.head.body), 0, None
