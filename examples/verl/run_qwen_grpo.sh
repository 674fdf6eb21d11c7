#!/usr/bin/env bash
# GRPO with verl on the kernel environment: Qwen2.5-Coder-1.5B-Instruct, vLLM rollouts, one
# node of 8 GPUs (a Ray cluster: start it with `ray start --head` first, or verl starts a
# local one). Run from the repository root in an environment with verl[vllm] installed.
#   bash examples/verl/run_qwen_grpo.sh [MODEL] [extra hydra overrides...]
set -euo pipefail
MODEL=${1:-Qwen/Qwen2.5-Coder-1.5B-Instruct}
shift || true
DATA=${DATA:-data/verl-kernels}
NGPUS=${NGPUS:-8}
ROLLOUT=${ROLLOUT:-vllm}  # or sglang

python3 -m multiminddev.integrations.verl_data --problems builtin:train --out "$DATA/train.parquet"
python3 -m multiminddev.integrations.verl_data --problems builtin:heldout --out "$DATA/val.parquet"

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/val.parquet" \
    data.train_batch_size=32 \
    data.max_prompt_length=2048 \
    data.max_response_length=6144 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.rollout.name="$ROLLOUT" \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.multi_turn.enable=True \
    actor_rollout_ref.rollout.agent.agent_loop_config_path=examples/verl/agent_loop.yaml \
    actor_rollout_ref.rollout.agent.default_agent_loop=multiminddev_kernel \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    trainer.critic_warmup=0 \
    trainer.logger='["console"]' \
    trainer.project_name=multiminddev \
    trainer.experiment_name=qwen-kernels-grpo \
    trainer.n_gpus_per_node="$NGPUS" \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=10 \
    trainer.total_training_steps=50 \
    "$@"
