"""The agents the package ships: LoRA adapters of the Generator and the Optimizer, with how they
were made.

Layout (package data, beside this file)::

    shipped/PROVENANCE.json          command, commit, data, held-out figures, model, settings
    shipped/generator/adapter_config.json, adapter_model.safetensors
    shipped/optimizer/adapter_config.json, adapter_model.safetensors

``shipped_adapters()`` finds them; ``optimize`` and ``bench`` use them by default when they are
there and the run's model is the one they were trained on (``--adapters none`` opts out). A
package without ``PROVENANCE.json`` ships no agents: the lookup gives None. One with it but
without both adapters, or with a provenance that lacks a key, is a broken install and an error:
shipping adapters nobody can trace, or half of them, is worse than shipping none.
"""

from __future__ import annotations

import json
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multiminddev.core.roles import AgentRole

SHIPPED_DIR = Path(__file__).resolve().parent
PROVENANCE_FILE = "PROVENANCE.json"
ADAPTER_CONFIG = "adapter_config.json"
SHIPPED_ROLES = (AgentRole.GENERATOR, AgentRole.OPTIMIZER)
# What PROVENANCE.json must say: the command that trained the adapters, the commit it ran at,
# the training data (problem specs), the held-out figures with the machine and date they were
# measured on, and the base model the adapters belong to (as --model takes it).
PROVENANCE_KEYS = ("command", "commit", "data", "heldout", "model")


class ShippedAgentsError(ValueError):
    """Shipped agents that cannot be used; the message says what is missing."""


@dataclass(frozen=True, kw_only=True)
class ShippedAgents:
    """The shipped adapters, per role, and their provenance (``PROVENANCE.json``)."""

    root: Path
    adapters: Mapping[AgentRole, Path]
    provenance: Mapping[str, Any]

    @property
    def model(self) -> str:
        """The base model the adapters were trained on, as ``--model`` takes it."""
        return str(self.provenance["model"])

    @property
    def settings(self) -> Mapping[str, Any]:
        """The training run's settings (its ``run_config.json``), where the provenance has them."""
        return types.MappingProxyType(dict(self.provenance.get("settings") or {}))

    @property
    def element_type_line(self) -> bool:
        """Whether the agents were trained on prompts ending with the element-type line; their
        prompts at inference must then have it too."""
        return bool(self.settings.get("element_type_line", False))

    def adapter_paths(self) -> dict[str, str]:
        """``PolicyConfig.adapter_paths``: {role name: adapter folder}."""
        return {role.value: str(path) for role, path in self.adapters.items()}


def shipped_agents(root: Path | None = None) -> ShippedAgents | None:
    """The agents shipped under ``root`` (default: the package's); None when there is no
    ``PROVENANCE.json``. Raises ``ShippedAgentsError`` for a provenance without an adapter of
    each role, or that cannot be read, or that lacks one of ``PROVENANCE_KEYS``."""
    root = SHIPPED_DIR if root is None else Path(root)
    path = root / PROVENANCE_FILE
    if not path.is_file():
        return None
    try:
        provenance = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ShippedAgentsError(f"{path}: not readable JSON ({exc}); reinstall the "
                                 "package") from None
    if not isinstance(provenance, dict):
        raise ShippedAgentsError(f"{path}: expected a JSON object")
    missing = [key for key in PROVENANCE_KEYS if key not in provenance]
    if missing:
        raise ShippedAgentsError(f"{path} lacks {', '.join(missing)}: shipped adapters need "
                                 "their command, commit, data, held-out figures and model")
    adapters = {role: root / role.value for role in SHIPPED_ROLES}
    absent = [role.value for role, folder in adapters.items()
              if not (folder / ADAPTER_CONFIG).is_file()]
    if absent:
        raise ShippedAgentsError(f"{root} has {PROVENANCE_FILE} but no {' or '.join(absent)} "
                                 f"adapter ({'/'.join(absent)}/{ADAPTER_CONFIG}); reinstall "
                                 "the package, or pass --adapters none")
    return ShippedAgents(root=root, adapters=types.MappingProxyType(adapters),
                         provenance=types.MappingProxyType(provenance))


def shipped_adapters(root: Path | None = None) -> dict[AgentRole, Path] | None:
    """{role: adapter folder} of the shipped agents; None when the package ships none."""
    agents = shipped_agents(root)
    return None if agents is None else dict(agents.adapters)


def write_provenance(root: Path, *, command: str, commit: str, data: Mapping[str, Any],
                     heldout: Mapping[str, Any], model: str = "default",
                     settings: Mapping[str, Any] | None = None) -> Path:
    """Write ``root/PROVENANCE.json`` for adapters put in ``root/{generator,optimizer}/``:
    what ``benchmarks/ship_agents.py`` runs after training the agents to ship (it checks the
    result reads back)."""
    path = Path(root) / PROVENANCE_FILE
    path.write_text(json.dumps({"command": command, "commit": commit, "data": dict(data),
                                "heldout": dict(heldout), "model": model,
                                "settings": dict(settings or {})}, indent=2) + "\n",
                    encoding="utf-8")
    try:
        shipped_agents(root)
    except ShippedAgentsError:  # no provenance without its adapters
        path.unlink()
        raise
    return path
