"""The agents of an episode (defined in ``core.roles``, which tasks and rewards also use)."""

from multiminddev.core.roles import AgentRole

__all__ = ["AgentRole"]
