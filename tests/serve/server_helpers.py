"""A real server on a free port (uvicorn in a thread) and a real LoRA adapter made with peft."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class RunningServer:
    def __init__(self, app, port: int):
        import uvicorn

        self.app = app
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self, timeout: float = 120.0) -> RunningServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
