"""CLI subcommands: each module exposes ``register(subparsers)`` and sets ``handler``."""
