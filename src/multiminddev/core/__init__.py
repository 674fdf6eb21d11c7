"""The floor every package builds on: shared types and helpers that import nothing above them.

Packages import downward only (see ``tests/test_layers.py``); a type that a low package
(``cuda``, ``env``, ``tasks``) and a higher one both need lives here, and the package it
came from re-exports it so existing imports keep working.
"""
