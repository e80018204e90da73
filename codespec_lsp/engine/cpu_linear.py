"""Linear layers fed a few rows on the CPU: the fastest of three equal products, timed once per CPU.

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
each way for every row count up to MAX_ROWS and once at LONG_ROWS (a prefill chunk), and a form
other than F.linear is used, in every layer, where it took at most MARGIN of F.linear's time. All
forms compute the same sums in another order: logits differ in the last bits, as they already did
between 1 and K+1 rows.

The timing takes about a hundred whole forwards: 5.5 of SmolLM2-135M's 5.8 s load on a 2-core
Xeon, idle, and 40 s beside two busy processes. It is done once per CPU, thread count, PyTorch
version and model shape: the plan is kept in the cache folder (`cpu_linear.json`, PLAN_CACHE_ENV
names another file or `off`), and a load that finds it only installs it. Delete the file to time
again (after a BLAS or machine change the key changes by itself).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

MAX_ROWS = 8
LONG_ROWS = 64     # stands for every longer count: prefill chunks
PACK_HINT = 4      # the batch size oneDNN lays the packed weight out for; 3 to 128 rows measured alike
MARGIN = 0.85
REPEATS = 3       # min of three; of five for 1 and 2 rows (decode, the commonest verify): on a
DECODE_REPEATS = 5  # shared machine two let noise pick a 1-row form 20 % slower than the best
LINEAR, TRANSPOSED, PACKED = "linear", "transposed", "packed"
PLAN_CACHE_ENV = "CODESPEC_CPU_LINEAR_CACHE"


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


def plan_cache() -> Path | None:
    """Where plans are kept: PLAN_CACHE_ENV's file, none when it says `off`, else the cache folder's."""
    chosen = os.environ.get(PLAN_CACHE_ENV, "").strip()
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen).expanduser()
    from codespec_lsp.engine.fetch import cache_dir
    return cache_dir() / "cpu_linear.json"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def plan_key(layers: list[torch.nn.Linear]) -> str:
    """What a plan holds for: the CPU, the threads, PyTorch and its BLAS, the layers' shapes and dtype."""
    shapes = [(*m.weight.shape, m.bias is not None, str(m.weight.dtype)) for m in layers]
    what = [_cpu_name(), torch.get_num_threads(), torch.__version__,
            torch.backends.mkldnn.is_available(), shapes]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:24]


def _read_plans(cache: Path) -> dict:
    try:
        plans = json.loads(cache.read_text())
        return plans if isinstance(plans, dict) else {}
    except (OSError, ValueError):
        return {}  # none yet, or a broken file: time again and write it whole


def _cached(cache: Path | None, key: str) -> dict[int, str] | None:
    plan = _read_plans(cache).get(key) if cache is not None else None
    if not isinstance(plan, dict):
        return None
    try:
        plan = {int(n): form for n, form in plan.items()}
    except ValueError:
        return None
    ok = set(plan) <= {*range(1, MAX_ROWS + 1), LONG_ROWS} and set(plan.values()) <= {TRANSPOSED, PACKED}
    return plan if ok else None


def _keep(cache: Path | None, key: str, plan: dict[int, str]) -> None:
    if cache is None:
        return
    plans = _read_plans(cache)
    plans[key] = {str(n): form for n, form in plan.items()}
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        # Written aside then renamed: two servers starting at once never read half a file.
        with tempfile.NamedTemporaryFile("w", dir=cache.parent, delete=False, suffix=".tmp") as f:
            json.dump(plans, f, indent=1)
    except OSError:
        return  # a read-only cache: the plan is timed again at the next load, nothing breaks
    try:
        os.replace(f.name, cache)
    except OSError:
        Path(f.name).unlink(missing_ok=True)


@torch.inference_mode()
def install(model: torch.nn.Module, cache: Path | None = None) -> dict[int, str]:
    """Switch `model`'s CPU nn.Linear layers to SmallBatchLinear with the plan kept in `cache`
    for this machine and shape, else one timed now (whole forwards over 1..MAX_ROWS and
    LONG_ROWS tokens each way: a layer timed alone sits in the cache, which in a forward it does
    not) and kept there. Returns {row count: form} where F.linear lost."""
    layers = [m for m in model.modules()
              if type(m) is torch.nn.Linear and m.weight.device.type == "cpu"]
    if not layers:
        return {}
    key = plan_key(layers)
    plan = _cached(cache, key)
    for layer in layers:
        layer.__class__ = SmallBatchLinear
        if plan is None or PACKED in plan.values():
            layer.packed = pack(layer.weight)
    packable = all(m.packed is not None for m in layers)
    if plan is None or (PACKED in plan.values() and not packable):
        plan = _time_forms(model, layers, packable)
        _keep(cache, key, plan)
    _set_forms(layers, plan)
    if PACKED not in plan.values():
        for layer in layers:
            layer.packed = None  # the second copy of the weights only where it is used
    return plan


def _time_forms(model: torch.nn.Module, layers: list[SmallBatchLinear], packable: bool
                ) -> dict[int, str]:
    forms = [LINEAR, TRANSPOSED] + ([PACKED] if packable else [])
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
    return plan
