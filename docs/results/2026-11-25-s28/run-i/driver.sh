[ -f /root/learning/base/partial.json ] || python3 benchmarks/bench_learning.py --model /root/stage/SmolLM2-135M-Instruct.Q4_1.gguf --output-dir /root/learning   --sft-problems builtin:tier0:train:allshapes:resized4+builtin:tier1:train:resized4*2+builtin:breadth:shapes1   --sft-steps 300 --eval-problems 39 --rl-steps 12   --rl-learning-rate 3e-5 --kl-reference start --rl-temperature 0.8   --compiled-decoding on --grpo-eval-every 0   --problems-per-step 4 --group-size 4   --max-new-tokens 800 --generator-max-new-tokens 512 --max-turns 2 --eval-workers 2   --eval-compiled-decoding off --eval-dtype float32 --family-sampling signal --element-type-line --sft-max-seq-length 2176 --max-turns 1 --eval-max-turns 2 --train-problems builtin:tier0,tier1:train:resized8from4 --curriculum-start-tier 1 --review-fraction 0.5 --problems-per-step 6 --mini-batch-size 24 --grad-accum 3 --grpo-roles generator --grpo-option normalize_std=false --grpo-option kl_coef=0.1 --select-problems builtin:tier0,tier1:train:resized2from12 --select-count 18 --select-every 6 --sft-strip-comments --sft-batch-size 4 --sft-grad-accum 2 --seeds 0 --base-only > /root/learning/base.log 2>&1 &
seeds="0 1 2"
sft_done() { [ -f /root/learning/seed$1/sft_checkpoints/optimizer/adapter_config.json ]; }
# waits until every other seed has finished SFT, ended, or is itself waiting to retry
wait_for_other_sfts() {
  local waited=0 s busy
  while [ $waited -lt 600 ]; do
    busy=0
    for s in $seeds; do
      [ $s = $1 ] || sft_done $s || [ -f /root/learning/seed$s.waiting ] ||
        [ -f /root/learning/seed$s.ended ] || busy=1
    done
    [ $busy = 0 ] && return
    sleep 10; waited=$((waited + 10))
  done
}
run_seed() {  # seed, delay: the seed's limit shrinks by its delay, so all end by SEED_LIMIT
  local seed=$1 delay=$2 start left
  sleep $delay; start=$(date +%s)
  timeout $(( 1690 - delay )) python3 benchmarks/bench_learning.py --model /root/stage/SmolLM2-135M-Instruct.Q4_1.gguf --output-dir /root/learning   --sft-problems builtin:tier0:train:allshapes:resized4+builtin:tier1:train:resized4*2+builtin:breadth:shapes1   --sft-steps 300 --eval-problems 39 --rl-steps 12   --rl-learning-rate 3e-5 --kl-reference start --rl-temperature 0.8   --compiled-decoding on --grpo-eval-every 0   --problems-per-step 4 --group-size 4   --max-new-tokens 800 --generator-max-new-tokens 512 --max-turns 2 --eval-workers 2   --eval-compiled-decoding off --eval-dtype float32 --family-sampling signal --element-type-line --sft-max-seq-length 2176 --max-turns 1 --eval-max-turns 2 --train-problems builtin:tier0,tier1:train:resized8from4 --curriculum-start-tier 1 --review-fraction 0.5 --problems-per-step 6 --mini-batch-size 24 --grad-accum 3 --grpo-roles generator --grpo-option normalize_std=false --grpo-option kl_coef=0.1 --select-problems builtin:tier0,tier1:train:resized2from12 --select-count 18 --select-every 6 --sft-strip-comments --sft-batch-size 4 --sft-grad-accum 2 --seeds $seed --skip-base > /root/learning/seed$seed.log 2>&1
  if [ $? -ne 0 ] && ! sft_done $seed && grep -q OutOfMemoryError /root/learning/seed$seed.log; then
    mv /root/learning/seed$seed.log /root/learning/seed$seed.oom.log
    touch /root/learning/seed$seed.waiting
    wait_for_other_sfts $seed
    rm -f /root/learning/seed$seed.waiting
    left=$(( 1690 - delay - ($(date +%s) - start) ))
    echo "seed $seed: SFT ran out of GPU memory; again with $left s left" >> /root/learning/retries.log
    [ $left -gt 60 ] && timeout $left python3 benchmarks/bench_learning.py --model /root/stage/SmolLM2-135M-Instruct.Q4_1.gguf --output-dir /root/learning   --sft-problems builtin:tier0:train:allshapes:resized4+builtin:tier1:train:resized4*2+builtin:breadth:shapes1   --sft-steps 300 --eval-problems 39 --rl-steps 12   --rl-learning-rate 3e-5 --kl-reference start --rl-temperature 0.8   --compiled-decoding on --grpo-eval-every 0   --problems-per-step 4 --group-size 4   --max-new-tokens 800 --generator-max-new-tokens 512 --max-turns 2 --eval-workers 2   --eval-compiled-decoding off --eval-dtype float32 --family-sampling signal --element-type-line --sft-max-seq-length 2176 --max-turns 1 --eval-max-turns 2 --train-problems builtin:tier0,tier1:train:resized8from4 --curriculum-start-tier 1 --review-fraction 0.5 --problems-per-step 6 --mini-batch-size 24 --grad-accum 3 --grpo-roles generator --grpo-option normalize_std=false --grpo-option kl_coef=0.1 --select-problems builtin:tier0,tier1:train:resized2from12 --select-count 18 --select-every 6 --sft-strip-comments --sft-batch-size 4 --sft-grad-accum 2 --seeds $seed --skip-base > /root/learning/seed$seed.log 2>&1
  fi
  touch /root/learning/seed$seed.ended
}
i=0
for seed in $seeds; do
  run_seed $seed $(( i >= 2 ? 0 : 0 )) &
  i=$((i + 1))
done
wait
finished=$(for s in 0 1 2; do [ -f /root/learning/seed$s/seed_result.json ] && printf '%s ' $s; done)
# every seed; else both the seeds that finished (results.md: their GRPO - SFT) and every seed's
# stages so far (results_partial.md). A seed cut before GRPO's evaluation leaves a partial.json
# whose stages hide the other seeds' GRPO (session 23); one that died in SFT, as seed 2 did on
# an H100 in session 22, leaves none.
if ! python3 benchmarks/bench_learning.py --model /root/stage/SmolLM2-135M-Instruct.Q4_1.gguf --output-dir /root/learning   --sft-problems builtin:tier0:train:allshapes:resized4+builtin:tier1:train:resized4*2+builtin:breadth:shapes1   --sft-steps 300 --eval-problems 39 --rl-steps 12   --rl-learning-rate 3e-5 --kl-reference start --rl-temperature 0.8   --compiled-decoding on --grpo-eval-every 0   --problems-per-step 4 --group-size 4   --max-new-tokens 800 --generator-max-new-tokens 512 --max-turns 2 --eval-workers 2   --eval-compiled-decoding off --eval-dtype float32 --family-sampling signal --element-type-line --sft-max-seq-length 2176 --max-turns 1 --eval-max-turns 2 --train-problems builtin:tier0,tier1:train:resized8from4 --curriculum-start-tier 1 --review-fraction 0.5 --problems-per-step 6 --mini-batch-size 24 --grad-accum 3 --grpo-roles generator --grpo-option normalize_std=false --grpo-option kl_coef=0.1 --select-problems builtin:tier0,tier1:train:resized2from12 --select-count 18 --select-every 6 --sft-strip-comments --sft-batch-size 4 --sft-grad-accum 2 --seeds 0 1 2 --aggregate-only > /root/learning/aggregate.log 2>&1; then
  rc=1
  [ -n "$finished" ] && python3 benchmarks/bench_learning.py --model /root/stage/SmolLM2-135M-Instruct.Q4_1.gguf --output-dir /root/learning   --sft-problems builtin:tier0:train:allshapes:resized4+builtin:tier1:train:resized4*2+builtin:breadth:shapes1   --sft-steps 300 --eval-problems 39 --rl-steps 12   --rl-learning-rate 3e-5 --kl-reference start --rl-temperature 0.8   --compiled-decoding on --grpo-eval-every 0   --problems-per-step 4 --group-size 4   --max-new-tokens 800 --generator-max-new-tokens 512 --max-turns 2 --eval-workers 2   --eval-compiled-decoding off --eval-dtype float32 --family-sampling signal --element-type-line --sft-max-seq-length 2176 --max-turns 1 --eval-max-turns 2 --train-problems builtin:tier0,tier1:train:resized8from4 --curriculum-start-tier 1 --review-fraction 0.5 --problems-per-step 6 --mini-batch-size 24 --grad-accum 3 --grpo-roles generator --grpo-option normalize_std=false --grpo-option kl_coef=0.1 --select-problems builtin:tier0,tier1:train:resized2from12 --select-count 18 --select-every 6 --sft-strip-comments --sft-batch-size 4 --sft-grad-accum 2 --seeds $finished --aggregate-only >> /root/learning/aggregate.log 2>&1 && rc=0
  python3 benchmarks/bench_learning.py --model /root/stage/SmolLM2-135M-Instruct.Q4_1.gguf --output-dir /root/learning   --sft-problems builtin:tier0:train:allshapes:resized4+builtin:tier1:train:resized4*2+builtin:breadth:shapes1   --sft-steps 300 --eval-problems 39 --rl-steps 12   --rl-learning-rate 3e-5 --kl-reference start --rl-temperature 0.8   --compiled-decoding on --grpo-eval-every 0   --problems-per-step 4 --group-size 4   --max-new-tokens 800 --generator-max-new-tokens 512 --max-turns 2 --eval-workers 2   --eval-compiled-decoding off --eval-dtype float32 --family-sampling signal --element-type-line --sft-max-seq-length 2176 --max-turns 1 --eval-max-turns 2 --train-problems builtin:tier0,tier1:train:resized8from4 --curriculum-start-tier 1 --review-fraction 0.5 --problems-per-step 6 --mini-batch-size 24 --grad-accum 3 --grpo-roles generator --grpo-option normalize_std=false --grpo-option kl_coef=0.1 --select-problems builtin:tier0,tier1:train:resized2from12 --select-count 18 --select-every 6 --sft-strip-comments --sft-batch-size 4 --sft-grad-accum 2 --seeds 0 1 2 --aggregate-partial >> /root/learning/aggregate.log 2>&1 && rc=0
else
  rc=0
fi
# the stages' correct kernels re-timed on the now quiet GPU: a paired comparison (RESCORE=0: no)
[ "0" = 0 ] || timeout 240 python3 benchmarks/rescore_heldout.py   /root/learning --seeds 0 1 2 --repeats 1 > /root/learning/rescore.log 2>&1 ||
  python3 benchmarks/rescore_heldout.py /root/learning --seeds 0 1 2 --aggregate-only >> /root/learning/rescore.log 2>&1
echo $rc > /root/learning/DONE
