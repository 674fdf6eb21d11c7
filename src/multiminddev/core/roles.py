"""The agents of an episode."""

import enum


class AgentRole(str, enum.Enum):
    GENERATOR = "generator"  # writes the first kernel from the problem
    OPTIMIZER = "optimizer"  # improves the current kernel from Tester feedback
    TESTER = "tester"  # rule-based: compiles, verifies, benchmarks; never trained

    @property
    def trainable(self) -> bool:
        return self is not AgentRole.TESTER
