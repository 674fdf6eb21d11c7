#!/usr/bin/env bash
# All GPU work of a session in two device calls (the embedded model travels in two halves).
#
# Here, once:   bash ../shared/tools/split-smollm2.sh
# Device call 1 (carry .stage/a):              bash benchmarks/gpu_session.sh stage-a
# Device call 2, within 30 s (carry .stage/b, .stage/whl):
#                                              bash benchmarks/gpu_session.sh run [PARTS...]
# PARTS (default: all): tests-env tests-hacks tests-corpus tests-rest bench-eval bench-generation
#                       bench-learning. Each part writes its log/results under $OUT and has its own
#                       time limit, so one slow part cannot eat the others' results.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
GGUF=/root/stage/SmolLM2-135M-Instruct.Q4_1.gguf

case "${1:-}" in
stage-a)
  mkdir -p /root/stage && cp .stage/a/part_aa /root/stage/ && echo "staged part a"
  exit 0 ;;
run) shift ;;
*) echo "usage: $0 stage-a | run [PARTS...]"; exit 2 ;;
esac

if [ ! -f "$GGUF" ]; then
  cat /root/stage/part_aa .stage/b/part_ab > "$GGUF" || { echo "stage-a first"; exit 1; }
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .stage/whl/*.whl || exit 1
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1 MULTIMINDDEV_DEFAULT_GGUF=$GGUF
PARTS=${*:-tests-env tests-hacks tests-corpus tests-rest bench-eval bench-generation bench-learning}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/machine.txt"
date -u | tee -a "$OUT/machine.txt"

for part in $PARTS; do
  echo "== $part"
  case $part in
  tests-env)   timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/env tests/cuda \
                 -k "not test_gpu_hacks" > "$OUT/$part.log" 2>&1 ;;
  tests-hacks) timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider \
                 tests/env/test_gpu_hacks.py > "$OUT/$part.log" 2>&1 ;;
  tests-corpus) MULTIMINDDEV_CORPUS_REPORT=$OUT/corpus_gpu.json timeout 400 python3 -m pytest \
                 -m gpu -q -p no:cacheprovider tests/tasks/test_gpu_solutions.py > "$OUT/$part.log" 2>&1 ;;
  tests-rest)  MULTIMINDDEV_DEFAULT_GGUF=$GGUF timeout 300 python3 -m pytest -m gpu -q \
                 -p no:cacheprovider tests/policy tests/rl tests/train tests/report tests/agents \
                 tests/episode > "$OUT/$part.log" 2>&1 ;;
  bench-eval)  timeout 400 python3 benchmarks/bench_eval.py --out "$OUT" --quick > "$OUT/$part.log" 2>&1 ;;
  bench-generation) timeout 400 python3 benchmarks/bench_generation.py --model "$GGUF" \
                 --batch 1 8 32 --new-tokens 256 --repeats 1 --episodes 8 --turns 2 \
                 > "$OUT/$part.log" 2>&1 ;;
  bench-learning) timeout 580 python3 benchmarks/bench_learning.py --model "$GGUF" --short \
                 --output-dir "$OUT/learning" > "$OUT/$part.log" 2>&1 ;;
  *) echo "unknown part $part" ;;
  esac
  echo "$part rc=$?" | tee -a "$OUT/summary.txt"
  tail -3 "$OUT/$part.log" 2>/dev/null
done
