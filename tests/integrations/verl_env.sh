#!/usr/bin/env bash
# Run the verl integration tests in a virtual environment of their own: verl 0.9 pins
# transformers<5.11, older than the rest of the project's stack, so it is not installed into
# the project's environment. The verl venv sees the project's environment (the site-packages of
# $PYTHON, default python3: torch, the CUDA bindings, pytest, ray, uvicorn), through a .pth file
# written on every run, and adds verl, the transformers it pins and verl's small pure-Python
# deps; nothing heavy (no torch, vLLM or SGLang) is downloaded. The project's environment may
# itself be a virtual environment: the verl venv does not look past it to the base interpreter.
#   bash tests/integrations/verl_env.sh [pytest args...]
# MULTIMINDDEV_VERL_VENV chooses the venv's directory (built once, reused afterwards).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${MULTIMINDDEV_VERL_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/multiminddev/verl-venv}
PYTHON=${PYTHON:-python3}

# The project's environment, as one `import site; ...` line (what --system-site-packages does
# for a base interpreter): its prefix joins site.PREFIXES, so site.getsitepackages() lists its
# site-packages (cuda.pathfinder finds the NVRTC wheel's library there), and addsitedir puts
# them on sys.path, running their .pth files (editable installs), after the verl venv's own
# site-packages, so verl's pinned transformers comes first.
project_sites=$("$PYTHON" -c 'import site, sys
dirs = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
adds = "; ".join(f"site.addsitedir({d!r})" for d in dirs)
print(f"import site; site.PREFIXES.append({sys.prefix!r}); {adds}")')

link_project_env() {
    local site
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\n' "$project_sites" > "$site/multiminddev_project_env.pth"
    # only the project's environment, never the base interpreter's packages behind it
    sed -i 's/^include-system-site-packages = true/include-system-site-packages = false/' \
        "$VENV/pyvenv.cfg"
}

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
link_project_env
if ! "$VENV/bin/python" -c "import verl.experimental.agent_loop" 2>/dev/null; then
    start=$(date +%s)
    # cachetools: imported by verl's rollout router but missing from verl's base requirements
    "$VENV/bin/python" -m pip install -q "verl>=0.9,<0.10" "transformers>=5.5.3,<5.11" cachetools
    echo "verl venv built in $(( $(date +%s) - start )) s at $VENV" >&2
fi
cd "$ROOT"
PYTHONPATH="$ROOT/src:$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/integrations/test_verl.py "$@"
