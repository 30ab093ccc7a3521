"""The runtime: what a training step with a checkpointing setting runs, and applying and undoing it. The core: ``apply``
(binds a :class:`~hf_ckpt.CheckpointConfig`), ``binding``, ``state`` (the one record), ``hooks``, ``probe``, ``counting``;
the typed settings: ``config``, ``plans``, ``request``, ``kinds``, ``extensions``; the checkpoint functions: ``functions``,
``offload``, ``head``, ``mlp_chunks``; what to act on: ``blocks``, ``selection``, ``target``; ``stacks/``; ``util/``;
``_torch`` (every private torch API). The bottom layer of pyproject.toml's contract: it imports no package above it."""
