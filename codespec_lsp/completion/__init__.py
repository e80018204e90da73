"""The completion layer: prompt building, token healing, the one completion pipeline and its
post-processing gates, the typing rhythm. Text and ids only: no LSP types, no tensors."""
