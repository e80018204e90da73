"""Benchmarks behind `codespec-lsp bench`: engine, quality and server, each writing JSON."""
