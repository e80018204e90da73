"""Linear layers fed a few rows on the CPU: the faster of two equal products, measured at load.

A verify forward feeds K+1 tokens, a keystroke's prefill one to four. For so few rows the BLAS
picks its kernel from the shape, and the one `F.linear` reaches (x @ W.T) can cost far more than
the bytes it reads. Measured on the 2-core EPYC this project runs on (MKL, torch 2.13, fp32):
SmolLM2-135M's forward over 2 tokens cost 1.65x its forward over 1, and its 49152x576 LM head
22.7 ms for 2 rows against 11.7 ms for 1. The same product written (W @ x.T).T reaches another
kernel: 4.2 ms for those 2 rows, and the whole 2-token forward costs what a 1-token one does.
One row is the odd one out: both forms reach a matrix-vector kernel, and with the attention fixed
(hf.CPU_ATTENTION) a whole 1-token forward cost 74-85 ms where a 2-token one cost 50-61; the row
copied to make two, run transposed, then cut back to one, cost 56. Which form wins depends on
the CPU, the thread count and the shape (with one thread the small layers prefer F.linear), so
whole forwards are timed both ways at load for every row count up to MAX_ROWS, and the
transposed form is used, in every layer, at the row counts where it took at most MARGIN of the
time. Long prefill chunks keep F.linear. Both forms compute the same sums in another order:
logits differ in the last bits, as they already did between 1 and K+1 rows.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

MAX_ROWS = 8
MARGIN = 0.85
REPEATS = 2


class SmallBatchLinear(torch.nn.Linear):
    """nn.Linear whose forward takes (W @ x.T).T for the row counts in `transposed_rows`.
    Installed by swapping the class of a loaded layer: weights and state-dict keys are untouched."""

    transposed_rows: frozenset[int] = frozenset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        count = rows.shape[0]
        if count not in self.transposed_rows:
            return F.linear(x, self.weight, self.bias)
        if count == 1:
            rows = torch.cat([rows, rows])  # a real copy: a stride-0 expand reached a slower kernel still
        # contiguous: the transposed rows, once split into heads, pushed attention off its fast kernel
        out = (self.weight @ rows.T).T[:count].contiguous()
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def _set_rows(layers: list[SmallBatchLinear], rows: frozenset[int]) -> None:
    for layer in layers:
        layer.transposed_rows = rows


@torch.inference_mode()
def install(model: torch.nn.Module) -> list[int]:
    """Switch `model`'s CPU nn.Linear layers to SmallBatchLinear and time whole forwards over
    1..MAX_ROWS tokens both ways (whole forwards: a layer timed alone sits in the cache, which in
    a forward it does not). Returns the row counts computed transposed."""
    layers = [m for m in model.modules()
              if type(m) is torch.nn.Linear and m.weight.device.type == "cpu"]
    if not layers:
        return []
    for layer in layers:
        layer.__class__ = SmallBatchLinear
    wins = set()
    for rows in range(1, MAX_ROWS + 1):
        ids = torch.zeros(1, rows, dtype=torch.long)
        best = {False: float("inf"), True: float("inf")}
        for _ in range(REPEATS):  # interleaved: a shared machine's noise hits both forms alike
            for transposed in (False, True):
                _set_rows(layers, frozenset({rows}) if transposed else frozenset())
                start = time.perf_counter()
                model(input_ids=ids)
                best[transposed] = min(best[transposed], time.perf_counter() - start)
        if best[True] <= MARGIN * best[False]:
            wins.add(rows)
    _set_rows(layers, frozenset(wins))
    return sorted(wins)
