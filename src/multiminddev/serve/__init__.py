"""Serving: an OpenAI-compatible server over the base model and named LoRA adapters, a
kernel-optimization API that runs Generator -> Tester -> Optimizer episodes as jobs, A/B rollout
of agent checkpoints, Prometheus metrics and a web page.

    from multiminddev.serve import ServeConfig, create_app
    app = create_app(ServeConfig(adapters={"generator": "ckpt/generator"}))

FastAPI and uvicorn (the ``serve`` extra) are imported by ``serve.app`` only, so importing this
package stays light.
"""

from multiminddev.serve.config import ServeConfig

__all__ = ["ServeConfig", "create_app"]


def __getattr__(name: str):  # create_app imports FastAPI, so it loads on first use
    if name == "create_app":
        from multiminddev.serve.app import create_app

        return create_app
    raise AttributeError(name)
