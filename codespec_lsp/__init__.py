"""codespec-lsp: local inline code completion over LSP, served by speculative decoding."""

__version__ = "0.1.0"

from pathlib import Path

# The embedded same-family pair (HF folders `draft` and `target`): the one definition of its path.
TINY_DIR = Path(__file__).resolve().parent / "models" / "tiny"
