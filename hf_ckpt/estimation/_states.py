"""Parameter, gradient and optimizer-state bytes, counted on the full model built on the meta device.

* parameters: every distinct parameter (tied weights once), in its dtype;
* gradients: one per trainable parameter the loss reaches (seen in the trace), in the parameter's dtype; with
  ``peft_config`` only the adapter weights train;
* optimizer states, as the optimizer allocates them on the first step, by the ``Trainer``'s ``optim`` name
  (:data:`hf_ckpt.meters.optimizer_states.TRAINER_OPTIMIZERS`, the table ``budget="auto"`` counts live optimizers
  with): AdamW/Adam keep ``exp_avg`` and ``exp_avg_sq`` in the parameter's dtype plus a 4-byte ``step`` per
  parameter, which lives on the host (device memory only on the CPU, or with ``adamw_torch_fused``); SGD with
  momentum keeps one buffer, plain SGD none; bitsandbytes' 8-bit states one byte an element and a float32 scale
  per 256 (32-bit below 4096 elements and, as the Trainer sets, for embeddings); Adafactor float32 row and column
  statistics;
* the optimizer step's temporaries (:func:`hf_ckpt.meters.optimizer_step.planned_step_bytes`), parameters in model
  order as the optimizer steps them.

Mixed precision with fp32 master weights is not modelled: the parameters train in ``dtype``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from torch import nn

from hf_ckpt.meters.optimizer_states import planned_state_bytes
from hf_ckpt.meters.optimizer_step import planned_step_bytes


@dataclass(frozen=True)
class States:
    parameters: int
    trainable_parameters: int
    parameters_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    step_bytes: int = 0  # what the optimizer's step allocates above its states (its temporaries)


def count_states(
    model: nn.Module, optimizer: str, device: str, receives_gradient: Callable[[str], bool] = lambda name: True,
    stored: Mapping[int, int] | None = None,
) -> States:
    """Bytes of the parameters, gradients and optimizer states of ``model`` trained with ``optimizer``.

    ``receives_gradient(name)`` tells whether the step reaches a parameter: one that gets no gradient gets no
    optimizer state either (``torch.optim`` skips parameters whose ``grad`` is None). ``stored``: ``id(parameter)``
    -> the bytes a quantized base keeps for it (:mod:`hf_ckpt.estimation._quantized`), in place of its dtype's.
    """
    stored = stored or {}
    named = list(model.named_parameters())  # each parameter once (tied weights under their first name)
    parameters = [p for _name, p in named]
    trainable = [p for name, p in named if p.requires_grad and receives_gradient(name)]
    trainable_bytes = sum(p.numel() * p.element_size() for p in trainable)
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    optimizer_bytes = sum(planned_state_bytes(optimizer, tuple(p.shape), p.element_size(), device, id(p) in embeddings)
                          for p in trainable)
    step_bytes = planned_step_bytes(optimizer, [(tuple(p.shape), p.element_size(), id(p) in embeddings)
                                                 for p in trainable], device)
    return States(
        parameters=sum(p.numel() for p in parameters),
        trainable_parameters=sum(p.numel() for p in trainable),
        parameters_bytes=sum(stored.get(id(p), p.numel() * p.element_size()) for p in parameters),
        gradients_bytes=trainable_bytes,
        optimizer_bytes=optimizer_bytes,
        step_bytes=step_bytes,
    )
