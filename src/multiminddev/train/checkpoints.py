"""Checkpoints, one folder per agent, plus a resumable ``latest/`` written atomically.

```
<output_dir>/
  sft_checkpoints/{generator,optimizer}/          SFT adapters (train/sft.py)
  rl_checkpoints/
    best_model_episode_N/{generator,optimizer,config.json}
    final_model/{generator,optimizer,training_metrics.json}
    latest/                                       everything --resume needs
      manifest.json        written last: a latest/ without it is incomplete
      config.json          the GRPO config
      trainer_state.pt     step, episodes, best reward, curriculum state, RNG states
      adapters/<role>.pt   the role's trainable tensors, in trainable_parameters() order
      optimizers/<role>.pt the role's optimizer state_dict
```

``latest/`` is built in a temporary sibling directory and renamed into place, so a crash while
writing leaves the previous checkpoint intact: at most the work since it is lost. Adapter
tensors are saved raw (not through a LoRA file format) so a resume restores them bit for bit.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RL_DIR = "rl_checkpoints"
SFT_DIR = "sft_checkpoints"
LATEST = "latest"
FINAL = "final_model"
MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.pt"


class CheckpointError(RuntimeError):
    """A checkpoint is missing or unreadable; the message names the file and what to do."""


@dataclass(kw_only=True)
class TrainerState:
    step: int = 0
    episodes: int = 0
    best_reward: float | None = None
    best_episode: int | None = None
    curriculum: dict[str, Any] | None = None
    rng: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


# --- RNG -----------------------------------------------------------------------------------------

def capture_rng(np_generator=None) -> dict[str, Any]:
    """Python, NumPy (global and the trainer's Generator), torch CPU and CUDA RNG states."""
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if np_generator is not None:
        state["numpy_generator"] = np_generator.bit_generator.state
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any], np_generator=None) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if np_generator is not None and "numpy_generator" in state:
        np_generator.bit_generator.state = state["numpy_generator"]
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- atomic directories --------------------------------------------------------------------------

@contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temp dir next to ``target``; on success it replaces ``target`` by rename."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    old = target.parent / f".{target.name}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_tree(tmp)
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.rename(target, old)  # a crash between these renames leaves .old, which load falls back to
    os.rename(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def _fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())


# --- per-role tensors ----------------------------------------------------------------------------

def role_tensors(policy, role) -> list:
    """The role's trainable parameters, in a stable order."""
    params = policy.trainable_parameters(role)
    if isinstance(params, dict):
        params = [params[k] for k in sorted(params)]
    out = []
    for p in params:
        out.append(p[1] if isinstance(p, tuple) else p)
    return out


def _role_name(role) -> str:
    return getattr(role, "value", str(role))


# --- latest/ (resumable) -------------------------------------------------------------------------

def save_latest(rl_dir: Path, *, policy, roles, optimizers: dict, state: TrainerState,
                config: dict[str, Any]) -> Path:
    """Write ``rl_dir/latest`` atomically; returns its path."""
    import torch

    target = Path(rl_dir) / LATEST
    with atomic_dir(target) as tmp:
        (tmp / "adapters").mkdir()
        (tmp / "optimizers").mkdir()
        files = ["config.json", TRAINER_STATE]
        for role in roles:
            name = _role_name(role)
            tensors = [t.detach().cpu().clone() for t in role_tensors(policy, role)]
            torch.save(tensors, tmp / "adapters" / f"{name}.pt")
            torch.save(optimizers[role].state_dict(), tmp / "optimizers" / f"{name}.pt")
            files += [f"adapters/{name}.pt", f"optimizers/{name}.pt"]
        (tmp / "config.json").write_text(json.dumps(config, indent=2, default=str))
        torch.save(asdict(state), tmp / TRAINER_STATE)
        manifest = {"files": files, "roles": [_role_name(r) for r in roles],
                    "step": state.step, "episodes": state.episodes}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return target


def find_latest(rl_dir: Path) -> Path:
    """The resumable checkpoint under ``rl_dir`` (or the output dir holding rl_checkpoints/)."""
    rl_dir = Path(rl_dir)
    if (rl_dir / RL_DIR).is_dir():
        rl_dir = rl_dir / RL_DIR
    for candidate in (rl_dir / LATEST, rl_dir / f".{LATEST}.old"):
        if (candidate / MANIFEST).exists():
            return candidate
    raise CheckpointError(
        f"no resumable checkpoint at {rl_dir / LATEST} (its {MANIFEST} is missing): the run "
        f"stopped before its first checkpoint or the path is wrong; point --resume at the run's "
        f"output dir, or start afresh without --resume"
    )


def load_latest(path: Path, *, policy, roles, optimizers: dict) -> tuple[TrainerState, dict]:
    """Restore adapters and optimizer states in place; returns (state, saved GRPO config)."""
    import torch

    path = Path(path)
    manifest = _read_json(path / MANIFEST)
    for rel in manifest.get("files", []):
        if not (path / rel).is_file():
            raise CheckpointError(
                f"checkpoint {path} is incomplete: {path / rel} is missing; resume from an "
                f"earlier copy or delete {path} and start afresh"
            )
    saved_roles = set(manifest.get("roles", []))
    for role in roles:
        name = _role_name(role)
        if name not in saved_roles:
            raise CheckpointError(f"checkpoint {path} has no state for role {name!r} "
                                  f"(it holds {sorted(saved_roles)}); train that role afresh")
        tensors = _torch_load(path / "adapters" / f"{name}.pt")
        params = role_tensors(policy, role)
        if len(tensors) != len(params) or any(a.shape != b.shape for a, b in zip(tensors, params)):
            raise CheckpointError(
                f"{path / 'adapters' / f'{name}.pt'} does not match the model's {name} adapter "
                f"(different model or LoRA rank?): resume with the same --model and LoRA settings"
            )
        with torch.no_grad():
            for p, t in zip(params, tensors):
                p.copy_(t.to(p.device, p.dtype))
        optimizers[role].load_state_dict(_torch_load(path / "optimizers" / f"{name}.pt"))
    state = TrainerState(**_torch_load(path / TRAINER_STATE))
    return state, _read_json(path / "config.json")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: the checkpoint is incomplete; resume from an "
                              f"earlier checkpoint or start afresh") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is corrupt ({exc}); delete the checkpoint directory "
                              f"{Path(path).parent} and resume from another or start afresh") from None


def _torch_load(path: Path) -> Any:
    import torch

    if not path.is_file():
        raise CheckpointError(f"{path} is missing: the checkpoint is incomplete; resume from an "
                              f"earlier checkpoint or start afresh")
    try:
        # weights_only=False: RNG states hold numpy arrays and tuples; these files are our own.
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for garbled files
        raise CheckpointError(f"{path} is corrupt ({type(exc).__name__}: {exc}); delete "
                              f"{path.parent} and resume from another checkpoint or start afresh") from None


# --- checkpoint layouts (best / final / sft) ---------------------------------------------------------

def save_role(policy, role, parent: Path) -> Path:
    """Save one role's adapter (or full model) into ``parent/<role>/`` in a loadable format."""
    parent = Path(parent)
    out = parent / _role_name(role)
    parent.mkdir(parents=True, exist_ok=True)
    if policy.separate:
        policy.models[role].save_pretrained(out)
        policy.tokenizer.save_pretrained(out)
    else:
        # peft writes a non-"default" adapter under parent/<adapter name>/.
        policy.peft_model.save_pretrained(str(parent), selected_adapters=[_role_name(role)])
    return out


def save_agents(policy, roles, target: Path) -> None:
    """Save each role's adapter into ``target/<role>/`` (generator/ and optimizer/)."""
    for role in roles:
        save_role(policy, role, target)


def save_best(rl_dir: Path, *, episode: int, policy, roles, config: dict[str, Any],
              metrics: dict[str, Any]) -> Path:
    """``rl_checkpoints/best_model_episode_N/{generator,optimizer,config.json}``; older bests go."""
    rl_dir = Path(rl_dir)
    target = rl_dir / f"best_model_episode_{episode}"
    with atomic_dir(target) as tmp:
        save_agents(policy, roles, tmp)
        (tmp / "config.json").write_text(
            json.dumps({"episode": episode, "metrics": metrics, "config": config}, indent=2,
                       default=str))
    for old in rl_dir.glob("best_model_episode_*"):
        if old != target:
            shutil.rmtree(old, ignore_errors=True)
    return target


def save_final(rl_dir: Path, *, policy, roles, training_metrics: dict[str, Any]) -> Path:
    """``rl_checkpoints/final_model/{generator,optimizer,training_metrics.json}``."""
    target = Path(rl_dir) / FINAL
    with atomic_dir(target) as tmp:
        save_agents(policy, roles, tmp)
        (tmp / "training_metrics.json").write_text(json.dumps(training_metrics, indent=2,
                                                              default=str))
    return target
