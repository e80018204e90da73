"""Linear layers fed a few rows on the CPU: the fastest of three equal products, measured at load.

A verify forward feeds K+1 tokens, a keystroke's prefill one to four. For so few rows the BLAS
picks its kernel from the shape, and the one `F.linear` reaches (x @ W.T) can cost far more than
the bytes it reads. Measured on the 2-core EPYC this project runs on (MKL, torch 2.13, fp32):
SmolLM2-135M's forward over 2 tokens cost 1.65x its forward over 1, and its 49152x576 LM head
22.7 ms for 2 rows against 11.7 ms for 1. The same product written (W @ x.T).T reaches another
kernel: 4.2 ms for those 2 rows, and the whole 2-token forward costs what a 1-token one does.
One row is the odd one out: both forms reach a matrix-vector kernel, and with the attention fixed
(hf.CPU_ATTENTION) a whole 1-token forward cost 74-85 ms where a 2-token one cost 50-61; the row
copied to make two, run transposed, then cut back to one, cost 56.

From three rows on, MKL's transposed kernel grows with the rows again (the 576x1536 down
projection: 0.13 ms for 2 rows, 0.25 for 3, 0.41 for 8), while oneDNN's product over a weight
reordered once into its blocked layout (the `packed` form, what PyTorch's own compiler uses on
CPUs) stays flat (0.13-0.16 ms for 3 to 8 rows) and takes a 128-row prefill chunk in 0.6-0.7 of
F.linear's time. It costs a second copy of the weights, kept only when some row count uses it.

Which form wins depends on the CPU, the thread count and the shape, so whole forwards are timed
each way at load for every row count up to MAX_ROWS and once at LONG_ROWS (a prefill chunk), and
a form other than F.linear is used, in every layer, where it took at most MARGIN of F.linear's
time. All forms compute the same sums in another order: logits differ in the last bits, as they
already did between 1 and K+1 rows.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

MAX_ROWS = 8
LONG_ROWS = 64     # stands for every longer count: prefill chunks
PACK_HINT = 4      # the batch size oneDNN lays the packed weight out for; 3 to 128 rows measured alike
MARGIN = 0.85
REPEATS = 3       # min of three; of five for 1 and 2 rows (decode, the commonest verify): on a
DECODE_REPEATS = 5  # shared machine two let noise pick a 1-row form 20 % slower than the best
LINEAR, TRANSPOSED, PACKED = "linear", "transposed", "packed"


class SmallBatchLinear(torch.nn.Linear):
    """nn.Linear whose forward takes the form `forms` names for the row count (longer counts:
    `forms[LONG_ROWS]`; unnamed: F.linear). Installed by swapping the class of a loaded layer:
    weights and state-dict keys are untouched; the packed copy is a plain attribute."""

    forms: dict[int, str] = {}
    packed: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        count = rows.shape[0]
        form = self.forms.get(count if count <= MAX_ROWS else LONG_ROWS, LINEAR)
        if form == PACKED:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        if form == LINEAR:
            return F.linear(x, self.weight, self.bias)
        if count == 1:
            rows = torch.cat([rows, rows])  # a real copy: a stride-0 expand reached a slower kernel still
        # contiguous: the transposed rows, once split into heads, pushed attention off its fast kernel
        out = (self.weight @ rows.T).T[:count].contiguous()
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's blocked copy of a CPU fp32 weight, or None where this PyTorch has no such op."""
    if weight.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_HINT)
    except (AttributeError, RuntimeError):
        return None


def _set_forms(layers: list[SmallBatchLinear], forms: dict[int, str]) -> None:
    for layer in layers:
        layer.forms = forms


@torch.inference_mode()
def install(model: torch.nn.Module) -> dict[int, str]:
    """Switch `model`'s CPU nn.Linear layers to SmallBatchLinear and time whole forwards over
    1..MAX_ROWS and LONG_ROWS tokens each way (whole forwards: a layer timed alone sits in the
    cache, which in a forward it does not). Returns {row count: form} where F.linear lost."""
    layers = [m for m in model.modules()
              if type(m) is torch.nn.Linear and m.weight.device.type == "cpu"]
    if not layers:
        return {}
    for layer in layers:
        layer.__class__ = SmallBatchLinear
        layer.packed = pack(layer.weight)
    forms = [LINEAR, TRANSPOSED] + ([PACKED] if all(m.packed is not None for m in layers) else [])
    plan = {}
    for rows in list(range(1, MAX_ROWS + 1)) + [LONG_ROWS]:
        ids = torch.zeros(1, rows, dtype=torch.long)
        # long chunks: the transposed form is for a few rows only
        best = dict.fromkeys([f for f in forms if rows <= MAX_ROWS or f != TRANSPOSED], float("inf"))
        if len(best) == 1:
            continue  # long chunks without a packed form: F.linear, nothing to time
        for _ in range(DECODE_REPEATS if rows <= 2 else REPEATS):  # interleaved: noise hits all alike
            for form in best:
                _set_forms(layers, {rows: form})
                start = time.perf_counter()
                model(input_ids=ids)
                best[form] = min(best[form], time.perf_counter() - start)
        winner = min(best, key=best.get)
        if winner != LINEAR and best[winner] <= MARGIN * best[LINEAR]:
            plan[rows] = winner
    _set_forms(layers, plan)
    if PACKED not in plan.values():
        for layer in layers:
            layer.packed = None  # the second copy of the weights only where it is used
    return plan
