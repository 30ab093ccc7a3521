"""``hf_ckpt.verify``: show that a model's checkpointing does what it says, on one step of real inputs.

:func:`verify` runs one training step with the model's current checkpointing setting and one step with
checkpointing switched off, from the same RNG state, and checks four things:

1. **Gradient parity.** Checkpointing must not change a gradient. The gradients of the two steps are compared
   per parameter group (:func:`parameter_groups`).
2. **What was recomputed.** The blocks that actually ran again in backward (measured by
   :class:`~hf_ckpt.runtime.counting.BlockRunCounter`) must be exactly the blocks the model's flags say are recomputed
   (:func:`~hf_ckpt.checkpointed_layers`). A mismatch means checkpointing is silently off somewhere (for example
   a monkeypatched layer ``forward`` on transformers >= 5.23, which checkpoints inside the class's ``forward``),
   or on where nobody asked for it.
3. **RNG replay.** A recomputed block that draws random numbers (dropout) must draw the same ones again: the RNG
   state when its recompute starts must equal the state when its forward started (``preserve_rng_state=False``
   breaks this).
4. **In-place modification of inputs.** A recomputed block reruns on the very tensors it was first given. If one
   of them was modified in place in between (its version counter moved), the recompute sees other values and
   the gradients are silently wrong. ``torch.utils.checkpoint`` checks the version of the tensors passed to it
   positionally, not of those in keyword arguments or bound in a ``functools.partial``, which is how
   transformers passes masks and position embeddings.

The model is left exactly as it was: its checkpointing flags (the same objects), hf_ckpt's state, training mode,
the gradients already accumulated in ``.grad`` and the global RNG state. ``hf-ckpt verify`` runs it from the
command line (:mod:`hf_ckpt.cli.verify`).
"""

from hf_ckpt.verification.check import verify
from hf_ckpt.verification.gradients import parameter_groups
from hf_ckpt.verification.report import GradientParity, InplaceInput, VerifyReport

__all__ = ["GradientParity", "InplaceInput", "VerifyReport", "parameter_groups", "verify"]
