"""shelfkit: a small library-loans package, written for `codespec-lsp bench context`."""
