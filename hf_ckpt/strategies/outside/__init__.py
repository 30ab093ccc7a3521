"""A plan's ``outside_blocks``: the cheap modules between the blocks (embeddings, norms, the head's activation),
recomputed in backward instead of keeping their outputs. ``hook`` is its runtime (the one saved-tensor hook);
``menu`` is the lab's part: the planner's ``"outside"`` option, measured in real steps.
"""
