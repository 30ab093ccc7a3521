"""The ``"selective"`` kind: torch's selective activation checkpointing with a named policy. ``spec`` is its
registered :class:`~hf_ckpt.BlockStrategy`; ``policy`` is its runtime (the policies, what keeps which op's output).
"""

from hf_ckpt.runtime.kinds import Strategy, register_lazy


def _kind() -> type[Strategy]:
    from hf_ckpt.strategies.selective.spec import Selective  # loaded when a setting first uses the kind
    return Selective


register_lazy("selective", _kind)
