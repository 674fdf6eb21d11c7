"""Serving: the HTTP server, its kernel-optimization jobs, A/B rollout, metrics and web page."""
