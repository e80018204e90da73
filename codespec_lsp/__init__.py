"""codespec-lsp: local inline code completion over LSP, served by speculative decoding."""

__version__ = "0.1.0"
