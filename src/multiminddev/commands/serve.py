"""``multiminddev serve``: an OpenAI-compatible server with per-agent adapters and a
kernel-optimization API (docs/serving.md).

    multiminddev serve --adapters generator=runs/x/checkpoints/final/generator \\
                              optimizer=runs/x/checkpoints/final/optimizer --port 8000

``model`` in a request names the base ("base") or an adapter; adapters named generator /
optimizer drive those roles in ``/v1/kernels/optimize`` jobs. Without --adapters (and with the
model they were trained on) the shipped agent adapters are served, and jobs prompt them as they
were trained (the element-type line included where their training had it).

With --api-key KEY (or $MULTIMINDDEV_API_KEY) every /v1/ route, the admin ones included, wants
'Authorization: Bearer KEY'; a --host beyond loopback is refused without a key.
"""

from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path
from typing import Any

from multiminddev.agents.shipped import ShippedAgents, ShippedAgentsError, shipped_agents
from multiminddev.commands._io import InputError, fail
from multiminddev.policy import PolicyError, adapter_paths_in
from multiminddev.policy.model import resolve_model_source
from multiminddev.serve import ServeConfig
from multiminddev.serve.auth import API_KEY_ENV


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve", help="serve the model and agent adapters over an OpenAI-compatible HTTP API",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default",
                   help="'default' (embedded SmolLM2-135M GGUF), hub id, local dir or .gguf file")
    p.add_argument("--adapters", nargs="*", default=None, metavar="NAME=PATH",
                   help="LoRA adapters to serve, each NAME=FOLDER, or one checkpoint folder "
                        "with generator/ and optimizer/ (default: the shipped adapters, if any; "
                        "none: the model alone)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cuda, cpu")
    p.add_argument("--state-dir", type=Path, default=None,
                   help="folder for finished jobs and A/B records (default: none kept)")
    p.add_argument("--max-running-jobs", type=int, default=2,
                   help="optimize episodes run at once (default 2)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"every /v1/ route then wants 'Authorization: Bearer KEY', as OpenAI's "
                        f"(default: ${API_KEY_ENV}; required with a --host beyond loopback)")
    p.add_argument("--adapter-root", action="append", type=Path, default=None,
                   metavar="FOLDER", dest="adapter_roots",
                   help="a folder that adapters named in requests (load_lora_adapter, A/B arms) "
                        "must lie in; repeat for several (default: --state-dir and the "
                        "shipped agents)")
    p.set_defaults(handler=run)


def parse_adapters(items: list[str]) -> dict[str, str]:
    """``["NAME=PATH", ...]`` or ``["CHECKPOINT_DIR"]`` -> {name: path}; ``["none"]`` or ``[]``
    -> no adapter."""
    adapters: dict[str, str] = {}
    if items == ["none"]:
        return adapters
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            try:
                adapters.update(adapter_paths_in(item))
            except PolicyError as exc:
                raise InputError(f"--adapters {item}: give NAME=PATH, or a checkpoint folder "
                                 f"with generator/ and optimizer/ ({exc})") from exc
            continue
        if not name or not path:
            raise InputError(f"--adapters {item!r}: give NAME=PATH")
        if name in adapters:
            raise InputError(f"--adapters names {name!r} twice")
        adapters[name] = path
    return adapters


def default_agents(model: str, adapters: list[str] | None) -> ShippedAgents | None:
    """The shipped agents, when the server uses them: no --adapters, and the model they were
    trained on."""
    if adapters is not None:
        return None
    try:
        agents = shipped_agents()
    except ShippedAgentsError as exc:
        raise InputError(str(exc)) from exc
    return agents if agents is not None and agents.model == model else None


def serve_config(args: argparse.Namespace) -> ServeConfig:
    """The server's settings from the command line (the shipped agents by default)."""
    agents = default_agents(args.model, args.adapters)
    adapters = agents.adapter_paths() if agents is not None else parse_adapters(
        args.adapters or [])
    return ServeConfig(model=args.model, adapters=adapters, host=args.host, port=args.port,
                       device=args.device, max_running_jobs=args.max_running_jobs,
                       state_dir=str(args.state_dir) if args.state_dir else None,
                       element_type_line=agents is not None and agents.element_type_line,
                       api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
                       adapter_roots=[str(r) for r in args.adapter_roots or []])


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError as exc:
        return fail(f"serving needs the serve extra: pip install 'multiminddev[serve]' ({exc})")

    try:
        config = serve_config(args)
        resolve_model_source(config.model)  # a bad --model fails here, before the server starts
    except (InputError, PolicyError, ValueError) as exc:
        return fail(" ".join(str(exc).split()))
    uvicorn.run(build_app(config), host=config.host, port=config.port, log_level="info")
    return 0


def build_app(config: Any) -> Any:
    """The app with what other serve modules contribute (A/B, metrics, web page): a module
    ``multiminddev.serve.extras`` with ``routers(config) -> list[APIRouter]`` and, optionally,
    ``install(app)`` (hooks on ``app.state.jobs``), where present."""
    # create_app builds the FastAPI app: FastAPI (the serve extra) loads only when serving.
    from multiminddev.serve import create_app

    try:
        extras = importlib.import_module("multiminddev.serve.extras")
    except ModuleNotFoundError as exc:
        if exc.name != "multiminddev.serve.extras":
            raise
        return create_app(config)
    app = create_app(config, routers=extras.routers(config))
    install = getattr(extras, "install", None)
    if install is not None:
        install(app)
    return app
