"""MultiMindDev: train language models to write fast, correct CUDA kernels with multi-turn,
multi-agent RL on a trustworthy kernel evaluation environment."""

__version__ = "0.1.0"
