"""Scale-out on a Ray cluster (the ``ray`` extra, imported lazily): rollout workers for GRPO
(``distributed.rollout``, ``distributed.grpo``)."""
