"""The ``"selective"`` kind: torch's selective activation checkpointing with a named policy. ``spec`` is its
registered :class:`~hf_ckpt.BlockStrategy`; ``policy`` is its runtime (the policies, what keeps which op's output).
"""
