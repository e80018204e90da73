#!/usr/bin/env bash
# One-command set-up on a fresh machine: a virtual environment in .venv with the package, its
# test tools and the VS Code extension's npm packages. Re-running it is harmless.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# The tested torch. Where a machine ships a local CPU wheel of it (as CI's does) pip takes that;
# elsewhere it comes from PyPI (a CUDA build on Linux). Installing it first keeps the project's
# range from pulling a newer, multi-GB release.
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[dev]"
if command -v npm >/dev/null 2>&1; then
  (cd editors/vscode && npm ci --no-audit --no-fund --loglevel=error)
else
  echo "npm not found: skipping the VS Code extension's packages" >&2
fi
# Opt-in: a real vLLM (its own venv, a few GB) for `serve --remote` demos and tests/test_vllm_e2e.py.
if [ "${CODESPEC_VLLM:-0}" = "1" ]; then
  bash scripts/serve_vllm.sh --install-only
fi
echo "set-up done: .venv/bin/codespec-lsp --help"
