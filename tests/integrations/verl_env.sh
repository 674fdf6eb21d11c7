#!/usr/bin/env bash
# Run the verl integration tests in a virtual environment of their own: verl 0.9 pins
# transformers<5.11, older than the rest of the project's stack, so it is not installed into
# the shared environment. The venv sees the shared site-packages (torch, the CUDA bindings,
# pytest, ray) and adds verl, the transformers it pins and verl's small pure-Python deps;
# nothing heavy (no torch, vLLM or SGLang) is downloaded.
#   bash tests/integrations/verl_env.sh [pytest args...]
# MULTIMINDDEV_VERL_VENV chooses the venv's directory (built once, reused afterwards).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${MULTIMINDDEV_VERL_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/multiminddev/verl-venv}
PYTHON=${PYTHON:-python3}

if ! "$VENV/bin/python" -c "import verl.experimental.agent_loop" 2>/dev/null; then
    start=$(date +%s)
    "$PYTHON" -m venv --system-site-packages "$VENV"
    # cachetools: imported by verl's rollout router but missing from verl's base requirements
    "$VENV/bin/python" -m pip install -q "verl>=0.9,<0.10" "transformers>=5.5.3,<5.11" cachetools
    echo "verl venv built in $(( $(date +%s) - start )) s at $VENV" >&2
fi
cd "$ROOT"
PYTHONPATH="$ROOT/src:$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/integrations/test_verl.py "$@"
