"""codespec-lsp: local inline code completion over LSP, served by speculative decoding."""

__version__ = "0.1.0"

from pathlib import Path

# The embedded same-family pair (HF folders `draft` and `target`): the one definition of its path.
TINY_DIR = Path(__file__).resolve().parent / "models" / "tiny"
# The smol preset's draft: an EAGLE head trained on SmolLM2-135M's hidden states
# (scripts/train_smol_eagle.py; it reads the target's embedding and LM head, so it ships alone).
SMOL_EAGLE_DIR = Path(__file__).resolve().parent / "models" / "smol_eagle"
