"""Put a finished training run's agents into the package as its shipped agents.

    PYTHONPATH=src python3 benchmarks/ship_agents.py RUN_DIR [--dest src/multiminddev/agents/shipped]

RUN_DIR is a ``multiminddev train`` output folder (one seed's, e.g. ``runs/m/seed0``). Copies
the adapters of ``RUN_DIR/rl_checkpoints/final_model/{generator,optimizer}`` (the agents the run
kept: with early stopping, the chosen step's; for a run with ``skip_rl``, the SFT agents of
``RUN_DIR/sft_checkpoints``) into DEST and writes ``DEST/PROVENANCE.json``:
the command that replays the run, the commit of this checkout, the training data (the run's
problem specs), the held-out figures (``eval_results.json`` and, where present,
``sft_eval_results.json``, with the device they were measured on) and the run's settings. Only
``adapter_config.json`` and ``adapter_model.safetensors`` are copied (a few MB); a run without
both adapters or without a held-out evaluation is refused, and DEST is left as it was.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
DATA_KEYS = ("sft_problems", "sft_data", "train_problems", "heldout_problems", "select_problems",
             "select_also")


def provenance_fields(run_dir: Path, commit: str) -> dict:
    """``write_provenance``'s arguments from a run folder; ``ValueError`` naming what is missing."""
    record_path, eval_path = run_dir / "run_config.json", run_dir / "eval_results.json"
    for path in (record_path, eval_path):
        if not path.is_file():
            raise ValueError(f"{path} is missing: ship agents of a finished train run")
    settings = json.loads(record_path.read_text())
    heldout = {"final": json.loads(eval_path.read_text())}
    if (run_dir / "sft_eval_results.json").is_file():
        heldout["sft"] = json.loads((run_dir / "sft_eval_results.json").read_text())
    command = settings.get("replay_command", f"multiminddev train --config {record_path}")
    for key in ("resume_command", "replay_command"):
        settings.pop(key, None)
    return {"command": command, "commit": commit, "heldout": heldout,
            "data": {k: settings.get(k) for k in DATA_KEYS if settings.get(k) is not None},
            "model": str(settings.get("model", "default")), "settings": settings}


def agents_dir(run_dir: Path) -> Path:
    """The folder of the agents a run kept: GRPO's final model, or the SFT agents of a run that
    skipped GRPO (``skip_rl`` in its ``run_config.json``)."""
    final = run_dir / "rl_checkpoints" / "final_model"
    record = run_dir / "run_config.json"
    if not final.exists() and record.is_file() and json.loads(record.read_text()).get("skip_rl"):
        return run_dir / "sft_checkpoints"
    return final


def to_float16(path: Path) -> None:
    """Rewrite a safetensors file's floating-point tensors in float16 (LoRA weights are small
    and well inside float16's range; peft casts them to the model's dtype on load)."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    save_file({k: (v.to(torch.float16) if v.is_floating_point() else v).contiguous()
               for k, v in tensors.items()}, str(path))


def main(argv: list[str] | None = None) -> int:
    from multiminddev.agents.shipped import SHIPPED_DIR, SHIPPED_ROLES, write_provenance

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--dest", type=Path, default=SHIPPED_DIR)
    p.add_argument("--commit", default=None,
                   help="the commit the run trained at (default: this checkout's HEAD)")
    p.add_argument("--float16", action="store_true",
                   help="store the adapter tensors in float16 (half the size)")
    args = p.parse_args(argv)
    final = agents_dir(args.run_dir)
    try:
        missing = [str(final / r.value / f) for r in SHIPPED_ROLES for f in ADAPTER_FILES
                   if not (final / r.value / f).is_file()]
        if missing:
            raise ValueError(f"no adapter files {', '.join(missing)}")
        commit = args.commit or subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True,
            check=False).stdout.strip() or "unknown"
        fields = provenance_fields(args.run_dir, commit)
        with tempfile.TemporaryDirectory(dir=args.dest.parent) as tmp:
            staged = Path(tmp)  # checked whole before anything in DEST changes
            for role in SHIPPED_ROLES:
                (staged / role.value).mkdir()
                for name in ADAPTER_FILES:
                    shutil.copyfile(final / role.value / name, staged / role.value / name)
                if args.float16:
                    to_float16(staged / role.value / "adapter_model.safetensors")
            write_provenance(staged, **fields)
            for role in SHIPPED_ROLES:
                shutil.rmtree(args.dest / role.value, ignore_errors=True)
                shutil.copytree(staged / role.value, args.dest / role.value)
            shutil.copyfile(staged / "PROVENANCE.json", args.dest / "PROVENANCE.json")
    except (OSError, ValueError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    print(f"shipped the agents of {args.run_dir} in {args.dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
