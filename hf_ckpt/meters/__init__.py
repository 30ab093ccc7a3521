"""What one training step retains, peaks at and computes: the measuring primitives the planners, the estimator's
check, ``verify`` and the bench build on. ``step`` runs and measures one step (:class:`~hf_ckpt.measure.StepMeasurement`),
``memory`` tracks tensor storages (:class:`~hf_ckpt.measure.StorageTracker`), ``flops`` counts FLOPs with recompute,
``precision`` reads the autocast a step runs in, ``optimizer_states`` counts the optimizer's state bytes (one table
of the ``Trainer``'s optimizers, for the estimate and ``budget="auto"`` alike), ``optimizer_step`` what its
``step()`` allocates above them. Public through :mod:`hf_ckpt.measure`; imports only the runtime.
"""
