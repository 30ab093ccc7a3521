"""Parameter, gradient and optimizer-state bytes, counted on the full model built on the meta device.

* parameters: every distinct parameter (tied weights once), in its dtype;
* gradients: one per trainable parameter the loss reaches (seen in the trace), in the parameter's dtype; with
  ``peft_config`` only the adapter weights train;
* optimizer states, as ``torch.optim`` allocates them on the first step: AdamW/Adam keep ``exp_avg`` and
  ``exp_avg_sq`` in the parameter's dtype plus a 4-byte ``step`` per parameter, which lives on the host (it is
  device memory only when the device is the CPU); SGD with momentum keeps one buffer; plain SGD none.

Mixed precision with fp32 master weights is not modelled: the parameters train in ``dtype``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

#: Optimizer name -> (state tensors per parameter, bytes of the host-side step counter per parameter).
OPTIMIZERS: dict[str, tuple[int, int]] = {"adamw": (2, 4), "adam": (2, 4), "sgd_momentum": (1, 0), "sgd": (0, 0)}


@dataclass(frozen=True)
class States:
    parameters: int
    trainable_parameters: int
    parameters_bytes: int
    gradients_bytes: int
    optimizer_bytes: int


def count_states(
    model: nn.Module, optimizer: str, device: str, receives_gradient: Callable[[str], bool] = lambda name: True
) -> States:
    """Bytes of the parameters, gradients and optimizer states of ``model`` trained with ``optimizer``.

    ``receives_gradient(name)`` tells whether the step reaches a parameter: one that gets no gradient gets no
    optimizer state either (``torch.optim`` skips parameters whose ``grad`` is None).
    """
    named = list(model.named_parameters())  # each parameter once (tied weights under their first name)
    parameters = [p for _name, p in named]
    trainable = [p for name, p in named if p.requires_grad and receives_gradient(name)]
    trainable_bytes = sum(p.numel() * p.element_size() for p in trainable)
    states, step_bytes = OPTIMIZERS[optimizer]
    optimizer_bytes = states * trainable_bytes + (step_bytes * len(trainable) if device == "cpu" else 0)
    return States(
        parameters=sum(p.numel() for p in parameters),
        trainable_parameters=sum(p.numel() for p in trainable),
        parameters_bytes=sum(p.numel() * p.element_size() for p in parameters),
        gradients_bytes=trainable_bytes,
        optimizer_bytes=optimizer_bytes,
    )
