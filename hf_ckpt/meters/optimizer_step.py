"""What an optimizer's ``step()`` allocates above the parameters, their gradients and its states: its temporaries.

Between steps the device holds the parameters, their gradients and the optimizer states
(:mod:`hf_ckpt.meters.optimizer_states`); while ``step()`` runs it also holds the tensors the update computes on
the way, freed when it returns. :func:`planned_step_bytes` gives the most of those alive at once for the optimizer
the ``Trainer`` builds for one ``optim`` name with the default ``TrainingArguments`` (``weight_decay=0``), from the
trainable parameters' shapes and element sizes alone, on the code path the device takes: torch's optimizers run
one parameter at a time on a CPU and ``foreach`` on CUDA (unless fused); bitsandbytes runs one fused kernel per
parameter on CUDA and torch ops on a CPU. Each family's formula names the code it follows; the CPU ones are
measured equal to the step (``tests/test_optimizer_step.py``). Sizes are the tensors' own bytes: allocator
rounding is not counted. Nothing a training step loads imports this module.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Callable, Sequence

import torch

from hf_ckpt.meters.optimizer_states import TrainerOptimizer, optimizer_named

#: A trainable parameter: (shape, element size in bytes, is an ``nn.Embedding`` weight).
Parameter = tuple[tuple[int, ...], int, bool]

#: bitsandbytes' ``min_8bit_size`` default: smaller parameters keep 32-bit state (and take the 32-bit kernel).
_MIN_8BIT_SIZE = 4096

#: bitsandbytes/backends/cpu/ops.py (``_optimizer_update_32bit_cpu``, ``_optimizer_update_8bit_blockwise_cpu``):
#: float32 tensors the size of the parameter each kernel holds at once, (32-bit state, 8-bit state), one more for
#: a parameter that is not float32 (its float32 copy); AdEMAMix's 8-bit kernel peaks while it re-quantizes a state.
_BNB_CPU = {"adam": (3, 5), "lion": (3, 5), "rmsprop": (3, 3), "ademamix": (4, 9)}
_BNB_REQUANTIZED_AT_PEAK = {"ademamix"}


def _elements(parameter: Parameter) -> int:
    return math.prod(parameter[0])


def _bytes(parameter: Parameter) -> int:
    return _elements(parameter) * parameter[1]


def _float32(parameter: Parameter) -> int:
    """Bytes of a float32 tensor the size of the parameter (of the parameter itself where it is wider)."""
    return _elements(parameter) * max(parameter[1], 4)


def _trainer_groups(parameters: Sequence[Parameter]) -> list[list[Parameter]]:
    """The Trainer's parameter groups, each in the model's order: with weight decay (matrices), then without
    (biases and norms' weights: one dimension); ``create_optimizer`` steps them one after the other."""
    return [[p for p in parameters if len(p[0]) >= 2], [p for p in parameters if len(p[0]) < 2]]


def _largest(parameters: Sequence[Parameter], made: Callable[[Parameter], int]) -> int:
    """The most one parameter's update holds, the update running one parameter at a time."""
    return max((made(parameter) for parameter in parameters), default=0)


def _chained(parameters: Sequence[Parameter], made: Callable[[Parameter], int], held: Callable[[Parameter], int]) -> int:
    """Like :func:`_largest`, while a local still holds ``held(previous parameter)`` (a loop variable that the
    next parameter's update rebinds only once it has made its own)."""
    previous = [0] + [held(parameter) for parameter in parameters[:-1]]
    return max((before + made(parameter) for before, parameter in zip(previous, parameters)), default=0)


def _foreach(parameters: Sequence[Parameter]) -> int:
    """torch's foreach ops, per Trainer group: one result like every parameter of a (device, dtype) group, the
    previous group's still bound while the next one's is made (the two largest; dtypes told by element size)."""
    most = 0
    for group in _trainer_groups(parameters):
        by_dtype: Counter[int] = Counter()
        for parameter in group:
            by_dtype[parameter[1]] += _bytes(parameter)
        most = max(most, sum(sorted(by_dtype.values(), reverse=True)[:2]))
    return most


def _torch_adam(name: str, spec: TrainerOptimizer, parameters: Sequence[Parameter], cpu: bool) -> int:
    """torch.optim.adam: ``_fused_adam`` (fused) none; ``_single_tensor_adam`` (CPU) ``denom = (exp_avg_sq.sqrt() /
    bias_correction2_sqrt)``, two, the previous parameter's ``denom`` still bound; ``_multi_tensor_adam`` (CUDA)
    ``_foreach_sqrt(exp_avg_sqs)``."""
    if spec.options.get("fused"):
        return 0
    if not cpu:
        return _foreach(parameters)
    return max(_chained(group, lambda p: 2 * _bytes(p), _bytes) for group in _trainer_groups(parameters))


def _torch_rmsprop(name: str, spec: TrainerOptimizer, parameters: Sequence[Parameter], cpu: bool) -> int:
    """torch.optim.rmsprop: ``_single_tensor_rmsprop`` (CPU) ``avg = square_avg.sqrt()``, the previous parameter's
    ``avg`` still bound; ``_multi_tensor_rmsprop`` (CUDA) ``avg = _foreach_sqrt(grouped_square_avgs)``."""
    if not cpu:
        return _foreach(parameters)
    return max(_chained(group, _bytes, _bytes) for group in _trainer_groups(parameters))


def _torch_sgd(name: str, spec: TrainerOptimizer, parameters: Sequence[Parameter], cpu: bool) -> int:
    """torch.optim.sgd without weight decay: ``param.add_(grad)`` and the momentum buffer's update, in place."""
    return 0


def _adafactor(name: str, spec: TrainerOptimizer, parameters: Sequence[Parameter], cpu: bool) -> int:
    """transformers.optimization.Adafactor.step (``beta1=None``; torch ops one parameter at a time on every
    device): float32 copies of a 16-bit gradient and parameter, ``update = grad**2 + eps`` made while the previous
    parameter's ``update`` is still bound, then ``_approx_sq_grad``'s row and column factors and their product
    (``exp_avg_sq.rsqrt()`` below two dimensions) while it is, then ``-update``."""
    def copies(parameter: Parameter) -> int:
        return 2 * _float32(parameter) * (parameter[1] < 4)

    def factors(parameter: Parameter) -> int:
        shape, size = parameter[0], max(parameter[1], 4)
        return size * math.prod(shape[:-2]) * (shape[-2] + shape[-1]) if len(shape) >= 2 else 0

    ordered = [parameter for group in _trainer_groups(parameters) for parameter in group]
    squared = _chained(ordered, lambda p: copies(p) + 2 * _float32(p), _float32)
    return max(squared, _largest(ordered, lambda p: copies(p) + 2 * _float32(p) + factors(p)))


def _bnb_kernel(name: str) -> str:
    """bitsandbytes' kernel name for ``optim=name``, checked in the order transformers'
    ``_get_bitsandbytes_optimizer`` picks the class (AdamW, Lion, RMSprop, AdEMAMix)."""
    return next(kernel for kernel in ("adam", "lion", "rmsprop", "ademamix") if kernel in name)


def _bitsandbytes(name: str, spec: TrainerOptimizer, parameters: Sequence[Parameter], cpu: bool) -> int:
    """bitsandbytes: one fused kernel per parameter on CUDA (none); on a CPU, :data:`_BNB_CPU`'s float32 tensors
    (8-bit state from ``min_8bit_size`` elements, never for embeddings in the Trainer's 8-bit optimizers)."""
    if not cpu:
        return 0
    kernel = _bnb_kernel(name)

    def made(parameter: Parameter) -> int:
        elements = _elements(parameter)
        eight = (spec.options["optim_bits"] == 8 and elements >= _MIN_8BIT_SIZE
                 and not (parameter[2] and spec.embeddings_32bit))
        requantized = elements + 4 * math.ceil(elements / 256) if eight and kernel in _BNB_REQUANTIZED_AT_PEAK else 0
        return (_BNB_CPU[kernel][eight] + (parameter[1] != 4)) * 4 * elements + requantized

    return _largest(parameters, made)


_FAMILIES: dict[object, Callable[[str, TrainerOptimizer, Sequence[Parameter], bool], int]] = {
    torch.optim.AdamW: _torch_adam,
    torch.optim.Adam: _torch_adam,
    torch.optim.RMSprop: _torch_rmsprop,
    torch.optim.SGD: _torch_sgd,
    "transformers.optimization.Adafactor": _adafactor,
}


def planned_step_bytes(name: str, parameters: Sequence[Parameter], device: str) -> int:
    """The most the step of the Trainer's ``optim=name`` allocates on ``device`` above the parameters, their
    gradients and the optimizer states it already holds, for trainable parameters given as ``(shape,
    element_size, is_embedding)`` in the model's order (``named_parameters``): a step holds the previous
    parameter's result while it makes the next one's, and the Trainer steps its parameter groups (with weight decay:
    matrices; without: one-dimensional weights) one after the other.

    ``device`` is ``"cpu"`` or an accelerator (``"cuda"``, ``"cuda:0"``, anything else counts as CUDA). The
    Trainer's default ``TrainingArguments`` are assumed (no weight decay). Raises ValueError naming ``optimizer``
    and the accepted names for an unknown ``name``.
    """
    spec = optimizer_named(name)
    family = _FAMILIES.get(spec.cls)
    if family is None and isinstance(spec.cls, str) and spec.cls.startswith("bitsandbytes."):
        family = _bitsandbytes
    if family is None:
        raise ValueError(f"optimizer: {name!r} has no step formula")
    cpu = str(device).split(":")[0] == "cpu"
    return family(name, spec, [(tuple(shape), size, bool(embedding)) for shape, size, embedding in parameters], cpu)
