"""The ``"partition:<F>[:norms]"`` kind: a block's forward and backward graphs split by torch's min-cut
partitioner, run in eager mode. ``spec`` is its registered :class:`~hf_ckpt.BlockStrategy`; ``graph``, ``norms``
and ``boundary`` are its runtime (the split graphs, the recomputable norms, the block output remade in backward);
the partition options each block type offers a planner are the lab's (:mod:`hf_ckpt.planning.menus.partition`).
The package registers the kind when ``hf_ckpt`` is imported; ``spec`` loads when a setting first uses it.
"""

from hf_ckpt.runtime.kinds import Strategy, register_lazy


def _kind() -> type[Strategy]:
    from hf_ckpt.strategies.partition.spec import Partition  # loaded when a setting first uses the kind
    return Partition


register_lazy("partition", _kind)
