"""A plan's ``outside_blocks``: the cheap modules between the blocks (embeddings, norms, the head's activation),
recomputed in backward instead of keeping their outputs. ``hook`` is its runtime (the one saved-tensor hook);
``menu`` is the lab's part: the planner's ``"outside"`` option, measured in real steps.

Not a strategy kind, on purpose (so not in :data:`hf_ckpt.strategies.KIND_MODULES`): a kind is what one block does
in backward, spelled in a plan's ``strategies``; this folder's option is about the modules *between* the blocks,
and a plan carries it as ``outside_blocks`` (module names), so plans' JSON stays as it is and
``CheckpointPlan(("outside",))`` stays an error. The planner's ``strategies=(..., "outside")`` names it as
:data:`hf_ckpt.strategies.OUTSIDE`, one of :data:`hf_ckpt.strategies.FINER_CHOICES` beside two kinds.
"""
