"""A real server on a free port (uvicorn in a thread) and a real LoRA adapter made with peft."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Self


def make_adapter(folder: Path, seed: int = 0) -> Path:
    """A LoRA adapter for the embedded model, with random B so it changes the output."""
    import torch
    from peft import LoraConfig, get_peft_model

    from multiminddev.policy import PolicyConfig, load_base_model

    base = load_base_model(PolicyConfig(device="cpu"))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM",
                                            target_modules=["q_proj", "v_proj"]))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    model.save_pretrained(folder)
    return folder


class UvicornThread:
    """A real uvicorn server for ``app`` on a free port, in a background thread:
    ``with UvicornThread(app) as srv: srv.url`` or ``srv = UvicornThread(app).start() ...
    srv.stop()``. ``lifespan="off"`` skips the app's startup (model loading)."""

    def __init__(self, app: Any, *, lifespan: str = "auto", start_timeout_s: float = 600.0):
        import uvicorn

        self.app = app
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                lifespan=lifespan)
        self.server = uvicorn.Server(config)
        self.start_timeout_s = start_timeout_s
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"uvicorn did not start within {self.start_timeout_s} s")
            time.sleep(0.02)
        return self

    @property
    def url(self) -> str:
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
