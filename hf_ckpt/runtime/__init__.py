"""The runtime: everything a training step with a checkpointing setting executes, and what applying and undoing that
setting needs. ``apply`` binds a :class:`~hf_ckpt.CheckpointConfig` to a model (``binding``: which function
checkpoints which block; ``state``: the one record of what was changed; ``hooks`` and ``probe``: what runs in each
step), ``functions`` and ``offload`` are the checkpoint functions, ``blocks``/``selection``/``target`` find what to
act on, ``config``/``plans`` are the typed settings, and ``_torch`` holds every private torch API the package uses.
The runtime never imports the lab (``planning``, ``budget``, ``estimate``, ``measure``, ``verification``, ``cli``,
and every strategy kind's ``menu``); ``tests/test_layers.py`` reads each module's layer from its path.
"""
