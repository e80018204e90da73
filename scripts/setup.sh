#!/usr/bin/env bash
# Set-up on a fresh machine, in parts (the Makefile runs each once, again only when its lock file
# changes; running one by hand is harmless):
#   bash scripts/setup.sh python      .venv with torch, the package and its test tools
#   bash scripts/setup.sh vscode      the VS Code extension's npm packages (skipped without npm)
#   bash scripts/setup.sh vscode-e2e  code-server + Node 24 + puppeteer-core for the real VS Code
#                                     test, in a cache outside the clone (skipped, with the reason
#                                     written down, when something it needs is missing)
#   bash scripts/setup.sh vllm        with CODESPEC_VLLM=1: vLLM in .venv-vllm (tests/test_vllm_e2e.py)
#   bash scripts/setup.sh             python, vscode (and vllm with CODESPEC_VLLM=1)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

setup_python() {
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  # The tested torch. Where a machine ships a local CPU wheel of it (as CI's does) pip takes that;
  # elsewhere it comes from PyPI (a CUDA build on Linux). Installing it first keeps the project's
  # range from pulling a newer, multi-GB release.
  .venv/bin/python -m pip install --quiet "torch==2.13.0"
  .venv/bin/python -m pip install --quiet -e ".[dev]"
  echo "python set-up done: .venv/bin/codespec-lsp"
}

setup_vscode() {
  if ! command -v npm >/dev/null 2>&1; then
    echo "npm not found: skipping the VS Code extension's packages (its tests will skip)" >&2
    return 0
  fi
  (cd editors/vscode && npm ci --no-audit --no-fund --prefer-offline --loglevel=error)
  echo "vscode set-up done"
}

# --- the real VS Code test (tests/test_vscode_e2e.py) ----------------------------------------
# code-server builds native modules against its own Node (24) on install: several minutes on
# a fresh machine, so the result lives in a cache keyed on editors/vscode/e2e/package-lock.json
# (and the Node version), shared by every clone on the machine, and is built once. The state
# file tells the test where it is, or why there is none.
E2E=editors/vscode/e2e
E2E_STATE=$E2E/.state.json
E2E_NODE=24.21.0
# CI's budget: a set-up that takes longer is stopped and the test skips; `make test` does not
# try again by itself (`make vscode-e2e-setup` does; the npm cache keeps what was downloaded).
E2E_TIMEOUT_S=${CODESPEC_E2E_TIMEOUT_S:-600}

e2e_state() {  # ok|skip, then the folder or the reason
  "${PYTHON}" -c 'import json,sys; ok=sys.argv[1]=="ok"; json.dump({"ok": ok, ("dir" if ok else "reason"): sys.argv[2]}, open(sys.argv[3], "w"))' "$1" "$2" "$E2E_STATE"
  [ "$1" = ok ] && echo "vscode-e2e set-up done: $2" || echo "vscode-e2e set-up skipped: $2" >&2
}

setup_vscode_e2e() {
  if [ "${CODESPEC_E2E:-1}" = 0 ]; then e2e_state skip "CODESPEC_E2E=0"; return 0; fi
  local missing=()
  command -v npm >/dev/null 2>&1 || missing+=("npm")
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
    || [ -n "${CODESPEC_CHROMIUM:-}" ] || missing+=("chromium (apt-get install chromium)")
  # code-server's kerberos module builds against these headers.
  [ -e /usr/include/gssapi/gssapi.h ] || [ -e /usr/include/krb5.h ] \
    || missing+=("Kerberos headers (apt-get install libkrb5-dev)")
  command -v make >/dev/null 2>&1 && command -v g++ >/dev/null 2>&1 || missing+=("make and g++ (build-essential)")
  if [ ${#missing[@]} -gt 0 ]; then
    e2e_state skip "missing: ${missing[*]}"
    return 0
  fi
  local key cache dir
  key=$(cat "$E2E/package-lock.json" <(echo "node $E2E_NODE") | sha256sum | cut -c1-16)
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/codespec-lsp
  dir=$cache/vscode-e2e-$key
  if [ -f "$dir/.done" ]; then
    e2e_state ok "$dir"
    return 0
  fi
  if [ -f "$dir/.failed" ] && [ "${CODESPEC_E2E_RETRY:-0}" != 1 ]; then
    e2e_state skip "$(cat "$dir/.failed") (retry: make vscode-e2e-setup)"
    return 0
  fi
  echo "vscode-e2e: installing code-server into $dir (first time only; up to $((E2E_TIMEOUT_S / 60)) min)" >&2
  # Installed in place (node-gyp builds may record their folder); .done marks a finished one.
  rm -rf "$dir" && mkdir -p "$dir/node24"
  cp "$E2E/package.json" "$E2E/package-lock.json" "$dir/"
  local log=$dir/install.log t0=$SECONDS
  if ! timeout "$E2E_TIMEOUT_S" bash -c '
      set -euo pipefail
      cd "$1"
      # Its own package.json, or npm would install into the folder above (it looks upwards).
      echo "{}" > node24/package.json
      npm install --prefix node24 --no-audit --no-fund --prefer-offline --loglevel=error "node@$2"
      [ "$(node24/node_modules/.bin/node --version)" = "v$2" ]
      export PATH=$PWD/node24/node_modules/.bin:$PATH
      # JOBS: node-gyp builds with every core; --omit=dev: code-server installs only what runs.
      JOBS=max npm ci --no-audit --no-fund --prefer-offline --omit=dev --loglevel=error
    ' _ "$dir" "$E2E_NODE" >"$log" 2>&1; then
    echo "the code-server install failed or passed ${E2E_TIMEOUT_S}s, after $((SECONDS - t0))s; log: $log" >"$dir/.failed"
    e2e_state skip "$(cat "$dir/.failed")"
    return 0
  fi
  echo "installed in $((SECONDS - t0))s" >>"$log"
  touch "$dir/.done"
  e2e_state ok "$dir"
}

# --- a real vLLM for tests/test_vllm_e2e.py (its own venv, ~3.5 GB; CODESPEC_VLLM=1) ----------
# CI sets CODESPEC_VLLM=1. A failed install warns and goes on: those tests then skip, saying why.
setup_vllm() {
  [ "${CODESPEC_VLLM:-0}" = 1 ] || return 0
  if ! bash scripts/serve_vllm.sh --install-only; then
    echo "WARNING: the vLLM install failed; tests/test_vllm_e2e.py will skip" >&2
  fi
  # vLLM also serves the real model (smol) in exact mode: fetched once into the user's cache.
  if ! .venv/bin/codespec-lsp fetch smol >/dev/null; then
    echo "WARNING: codespec-lsp fetch smol failed; the smol vLLM test will skip" >&2
  fi
}

case "${1:-all}" in
  python) setup_python ;;
  vscode) setup_vscode ;;
  vscode-e2e) setup_vscode_e2e ;;
  vllm) setup_vllm ;;
  all) setup_python; setup_vscode; setup_vllm ;;
  *) echo "usage: $0 [python|vscode|vscode-e2e|vllm|all]" >&2; exit 2 ;;
esac
