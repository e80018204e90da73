#!/usr/bin/env bash
# One short GPU session, as run on a lent H200 (the project never depends on it): the planner's
# figures (scripts/gpu_bench.py), then the shipped tiny pair's engine bench on CUDA in fp16 (what a GPU
# serves in) and fp32, whose `lossless` says whether speculative greedy still equals the target's own
# greedy once verification runs in CUDA kernels. Wheels in .whl/ pin the project's transformers over
# the image's. Output goes to $OUT (or ./gpu_out).
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/nvidia_smi.csv"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
timeout 300 python3 scripts/gpu_bench.py --out "$OUT/gpu_bench_h200.json" --budget-s 200 2>&1 | tee "$OUT/gpu_bench.log"
for dtype in float16 float32; do
  timeout 150 python3 -m codespec_lsp.cli bench engine --preset tiny --device cuda --dtype $dtype \
    --json "$OUT/engine_cuda_tiny_$dtype.json" 2>&1 | tail -25 | tee "$OUT/engine_$dtype.log"
done
