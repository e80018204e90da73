"""Write the embedded tiny target as a GGUF file (the `gguf` package's writer), as llama.cpp's
converter would: the tests of GGUF loading and `fetch` need a real GGUF and no network."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from codespec_lsp import TINY_DIR

CONTROL, NORMAL = 3, 1


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (transformers reverses it on load)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, folder: Path = TINY_DIR / "target") -> Path:
    import gguf

    cfg = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    weights = {k: v.astype(np.float32) for k, v in load_file(str(folder / "model.safetensors")).items()}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_rope_dimension_count(cfg["head_dim"])
    writer.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {t["content"] for t in tok.get("added_tokens", []) if t.get("special")}
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([t for t, _ in vocab])
    writer.add_token_types([CONTROL if t in special else NORMAL for t, _ in vocab])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    writer.add_bos_token_id(cfg["bos_token_id"])
    writer.add_eos_token_id(cfg["eos_token_id"])
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        for hf_name, gg_name in names.items():
            w = weights[f"model.layers.{i}.{hf_name}.weight"]
            if gg_name == "attn_q":
                w = _permute(w, cfg["num_attention_heads"])
            elif gg_name == "attn_k":
                w = _permute(w, cfg["num_key_value_heads"])
            writer.add_tensor(f"blk.{i}.{gg_name}.weight", np.ascontiguousarray(w))
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
