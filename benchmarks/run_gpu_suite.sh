#!/usr/bin/env bash
# The GPU test suite and the GPU benchmarks, on any machine with an NVIDIA GPU.
#
#   bash install.sh                                # once
#   bash benchmarks/run_gpu_suite.sh [MODEL]
#
# MODEL is what the model benchmarks load: "default" (the embedded SmolLM2-135M-Instruct that
# install.sh installs), a GGUF file, a local model folder or a hub id. A GGUF file also becomes
# the model of the tests that need one (MULTIMINDDEV_DEFAULT_GGUF). Logs, JSON and Markdown go
# to $OUT (default ./gpu-suite-<UTC time>); docs/BENCHMARKS.md says how each figure is read.
# Environment: QUICK=1 runs bench_eval.py's quick mode; PARTS="tests-env bench-eval" runs only
# those parts (all by default). Every part runs even if an earlier one fails; the script exits
# non-zero if any part failed.
set -uo pipefail
cd "$(dirname "$0")/.."

MODEL=${1:-default}
OUT=${OUT:-gpu-suite-$(date -u +%Y%m%dT%H%M%SZ)}
PARTS=${PARTS:-tests-env tests-hacks tests-corpus tests-rest bench-eval bench-eval-dir bench-generation bench-sft-memory}
mkdir -p "$OUT"
case $MODEL in
  *.gguf) export MULTIMINDDEV_DEFAULT_GGUF=$(readlink -f "$MODEL") ;;
esac
PYTEST="python3 -m pytest -m gpu -q -rfs -p no:cacheprovider"

if ! nvidia-smi -L > "$OUT/machine.txt" 2>&1; then
  echo "no NVIDIA GPU found (nvidia-smi -L failed): run this on a GPU machine" >&2
  exit 2
fi
{ git rev-parse --short HEAD 2>/dev/null || echo "commit unknown"; date -u; } >> "$OUT/machine.txt"
multiminddev doctor --json > "$OUT/doctor.json" 2> "$OUT/doctor.log" \
  || echo "multiminddev doctor failed: see $OUT/doctor.log" >&2

run_part() {
  case $1 in
    tests-env)   $PYTEST tests/env tests/cuda -k "not test_gpu_hacks" ;;
    tests-hacks) $PYTEST tests/env/test_gpu_hacks.py ;;
    tests-corpus) MULTIMINDDEV_CORPUS_REPORT=$OUT/corpus_gpu.json \
                   $PYTEST tests/tasks ;;
    tests-rest)  $PYTEST tests --ignore=tests/env --ignore=tests/cuda --ignore=tests/tasks ;;
    bench-eval)  python3 benchmarks/bench_eval.py --out "$OUT/bench_eval" ${QUICK:+--quick} ;;
    bench-eval-dir) python3 benchmarks/bench_eval_dir.py --out "$OUT/bench_eval_dir" ;;
    bench-generation) python3 benchmarks/bench_generation.py --model "$MODEL" --batch 16 \
                   --new-tokens 512 --repeats 1 --compiled-decoding off on \
                   --out "$OUT/generation.jsonl" ;;
    bench-sft-memory) python3 benchmarks/bench_sft_memory.py --model "$MODEL" --batch 4 8 \
                   --out "$OUT/sft_memory" ;;
    *) echo "unknown part '$1'; parts: tests-env tests-hacks tests-corpus tests-rest" \
            "bench-eval bench-eval-dir bench-generation bench-sft-memory" >&2; return 2 ;;
  esac
}

failed=()
for part in $PARTS; do
  start=$(date +%s)
  run_part "$part" > "$OUT/$part.log" 2>&1
  rc=$?
  summary=$(grep -E "passed|failed|skipped|error|no tests ran" "$OUT/$part.log" | tail -n 1)
  printf '%-17s rc=%-3s %4ss  %s\n' "$part" "$rc" "$(( $(date +%s) - start ))" "$summary" \
    | tee -a "$OUT/summary.txt"
  [ "$rc" -eq 0 ] || failed+=("$part")
done
echo "logs in $OUT/"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
