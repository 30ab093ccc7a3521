"""The runtime: everything a training step with a checkpointing setting executes, and what applying and undoing that
setting needs. ``apply`` binds a :class:`~hf_ckpt.CheckpointConfig` to a model (``binding``: which function
checkpoints which block; ``state``: the one record of what was changed; ``hooks`` and ``probe``: what runs in each
step), ``functions`` and ``offload`` are the checkpoint functions, ``blocks``/``selection``/``target`` find what to
act on, ``config``/``plans``/``request`` are the typed settings (every caller's one door: an ``EnableRequest``),
``kinds`` is the strategy registry, ``extensions`` what the packages above register, and ``_torch`` holds every
private torch API the package uses. The runtime is the bottom layer of ``pyproject.toml``'s import-linter contract:
it imports no other package of hf_ckpt.
"""
