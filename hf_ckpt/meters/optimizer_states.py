"""What an optimizer's first step will allocate: the state ``budget="auto"`` leaves room for.

``torch.optim`` optimizers (and most others) make their per-parameter state lazily, at the first ``step()``:
after the first forward, where a budget without ``sample_inputs`` is planned. :func:`pending_state_bytes` predicts
it from the optimizer itself (its class, each parameter group's options, each parameter's shape, dtype and
device), counting only the parameters that have no state yet: an optimizer restored from a checkpoint (the
``Trainer`` resuming) already holds its state, which the free memory read at the first batch has already paid for.

A class is known by registration (:func:`register_optimizer_states`), looked up along its MRO, so a subclass of
``AdamW`` is counted as ``AdamW``. Registered here, each count tested against the state a real step allocates:
every ``torch.optim`` optimizer with per-parameter state (not ``LBFGS``, whose history is one flat state),
transformers' ``Adafactor`` (``optim="adafactor"``) and the bitsandbytes optimizers the ``Trainer`` builds
(``optim="adamw_bnb_8bit"``, ``"paged_adamw_8bit"``, ``"lion_8bit"``, ``"rmsprop_bnb"``, ``"ademamix_8bit"``, ...,
8-bit and 32-bit). Classes of optional packages are registered by their dotted name, so nothing is imported.
Wrappers that keep the real optimizer as ``.optimizer`` (accelerate's ``AcceleratedOptimizer``) are unwrapped.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Union

import torch

#: ``state_bytes(optimizer, group, parameter) -> int``: the bytes the first step allocates on ``parameter``'s
#: device for that trainable parameter of ``group`` (the parameter group: its options).
StateBytes = Callable[[Any, dict, torch.Tensor], int]

_REGISTRY: dict[Union[type, str], StateBytes] = {}

#: Bytes of a scalar state tensor (float32: torch's ``step``).
SCALAR_BYTES = 4


def register_optimizer_states(cls: Union[type, str], state_bytes: StateBytes) -> None:
    """Tell ``budget="auto"`` what ``cls``'s first step allocates for each trainable parameter.

    Args:
        cls: The optimizer class (its subclasses are counted the same way), or its dotted name
            (``"my_package.optim.Lion"``) to register it without importing it.
        state_bytes: ``state_bytes(optimizer, group, parameter) -> int``: the bytes of the state the first step
            makes for ``parameter`` (a member of the parameter group ``group``) on the parameter's device. State
            the optimizer keeps on the host while the parameter is on an accelerator does not count.

    Example: one momentum buffer the size and dtype of each parameter::

        hf_ckpt.register_optimizer_states(Lion, lambda optimizer, group, p: p.numel() * p.element_size())
    """
    if not (isinstance(cls, type) or (isinstance(cls, str) and "." in cls)):
        raise TypeError(f"cls must be an optimizer class or its dotted name ('package.module.Class'); got {cls!r}")
    if not callable(state_bytes):
        raise TypeError("state_bytes must be a callable (optimizer, group, parameter) -> int; "
                        f"got {type(state_bytes).__name__}")
    _REGISTRY[cls] = state_bytes


def _dotted(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def unwrap(optimizer: Any) -> Any:
    """The optimizer inside wrappers that hold it as ``.optimizer`` (accelerate's ``AcceleratedOptimizer``)."""
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return optimizer


def registered_state_bytes(optimizer: Any) -> StateBytes | None:
    """The registered count for ``optimizer``'s class or its nearest registered base; None when unknown."""
    for cls in type(unwrap(optimizer)).__mro__:
        for key in (cls, _dotted(cls)):
            if key in _REGISTRY:
                return _REGISTRY[key]
    return None


def pending_state_bytes(optimizer: Any) -> int | None:
    """Bytes that ``optimizer``'s first step will allocate on the parameters' devices for the trainable parameters
    that have no state yet; None when its class is not registered."""
    optimizer = unwrap(optimizer)
    state_bytes = registered_state_bytes(optimizer)
    if state_bytes is None:
        return None
    return sum(state_bytes(optimizer, group, parameter) for group in optimizer.param_groups
               for parameter in group["params"] if parameter.requires_grad and not optimizer.state.get(parameter))


# -- torch.optim: buffers the size and dtype of the parameter, and float32 ``step`` scalars ----------------------


def _scalar_bytes(scalars: int, group: dict, parameter: torch.Tensor) -> int:
    """Bytes of ``scalars`` float32 ``step``-like scalars on ``parameter``'s device: torch keeps them on the host
    unless the parameter is there too, or the group is capturable or fused."""
    on_device = parameter.device.type == "cpu" or bool(group.get("capturable") or group.get("fused"))
    return on_device * scalars * SCALAR_BYTES


def _like_parameter(buffers: Callable[[dict], int], scalars: int, optimizer: Any, group: dict,
                    parameter: torch.Tensor) -> int:
    """``buffers(group)`` tensors like ``parameter``, and ``scalars`` float32 scalars (:func:`_scalar_bytes`)."""
    return buffers(group) * parameter.numel() * parameter.element_size() + _scalar_bytes(scalars, group, parameter)


def _adam(group: dict) -> int:
    return 3 if group.get("amsgrad") else 2


def _rmsprop(group: dict) -> int:
    return 1 + bool(group.get("momentum")) + bool(group.get("centered"))


def _factored(parameter: torch.Tensor) -> int:
    """Elements of Adafactor's row and column statistics of a parameter of two or more dimensions."""
    *batch, rows, columns = parameter.shape
    return math.prod(batch) * (rows + columns)


def _torch_adafactor(optimizer: Any, group: dict, parameter: torch.Tensor) -> int:
    """``torch.optim.Adafactor``: row and column variances (one full variance below two dimensions) in the
    parameter's dtype, and ``step`` on the host."""
    elements = _factored(parameter) if parameter.dim() >= 2 else parameter.numel()
    return elements * parameter.element_size() + _scalar_bytes(1, group, parameter)


for _cls, _buffers, _scalars in (
    (torch.optim.Adam, _adam, 1),
    (torch.optim.AdamW, _adam, 1),
    (torch.optim.NAdam, lambda group: 2, 2),
    (torch.optim.RAdam, lambda group: 2, 1),
    (torch.optim.Adamax, lambda group: 2, 1),
    (torch.optim.Adadelta, lambda group: 2, 1),
    (torch.optim.Adagrad, lambda group: 1, 1),  # made in __init__: nothing is pending at the first step
    (torch.optim.ASGD, lambda group: 1, 3),
    (torch.optim.Rprop, lambda group: 2, 1),
    (torch.optim.RMSprop, _rmsprop, 1),
    (torch.optim.SGD, lambda group: 1 if group.get("momentum") else 0, 0),
    (getattr(torch.optim, "Muon", None), lambda group: 1, 0),  # torch >= 2.9
    (getattr(torch.optim, "SparseAdam", None), lambda group: 2, 0),
):
    if _cls is not None:
        register_optimizer_states(_cls, functools.partial(_like_parameter, _buffers, _scalars))
if hasattr(torch.optim, "Adafactor"):  # torch >= 2.5
    register_optimizer_states(torch.optim.Adafactor, _torch_adafactor)


# -- transformers' Adafactor (``optim="adafactor"``): float32 state whatever the parameter's dtype ---------------


def _transformers_adafactor(optimizer: Any, group: dict, parameter: torch.Tensor) -> int:
    """Row and column averages of the squared gradient (the full average below two dimensions), the first
    moment where ``beta1`` is set, and the ``RMS`` scalar: all float32 on the parameter's device."""
    elements = _factored(parameter) if parameter.dim() >= 2 else parameter.numel()
    if group.get("beta1") is not None:
        elements += parameter.numel()
    return 4 * (elements + 1)


register_optimizer_states("transformers.optimization.Adafactor", _transformers_adafactor)


# -- bitsandbytes: 8-bit blockwise states (one byte an element, a float32 absmax per block of 256) ---------------


def _bitsandbytes(states: int, absmax: int, unorm: bool, optimizer: Any, group: dict, parameter: torch.Tensor) -> int:
    """``states`` state buffers: uint8 with ``absmax`` float32 scales per block of 256 elements where the
    parameter's config asks for 8 bits and it has at least ``min_8bit_size`` elements, float32 otherwise; plus
    ``unorm_vec`` where ``max_unorm`` is set and ``unorm``. The quantization maps (2 KiB shared by all
    parameters) are not counted."""
    gindex = next(i for i, candidate in enumerate(optimizer.param_groups) if candidate is group)
    pindex = next(i for i, candidate in enumerate(group["params"]) if candidate is parameter)
    config = optimizer.get_config(gindex, pindex, group)
    elements = parameter.numel()
    if config["optim_bits"] == 8 and elements >= config["min_8bit_size"]:
        total = states * elements + absmax * 4 * math.ceil(elements / 256)
    else:
        total = states * 4 * elements
    return total + 4 * (unorm and config.get("max_unorm", 0.0) > 0.0)


for _name, _states, _absmax, _unorm in (
    ("bitsandbytes.optim.optimizer.Optimizer1State", 1, 1, True),  # Lion, SGD, RMSprop, Adagrad, LARS
    ("bitsandbytes.optim.optimizer.Optimizer2State", 2, 2, True),  # Adam, AdamW, LAMB, paged or not
    ("bitsandbytes.optim.ademamix.AdEMAMix", 3, 3, False),  # two EMAs in a double buffer, and nu
):
    register_optimizer_states(_name, functools.partial(_bitsandbytes, _states, _absmax, _unorm))


# -- the Trainer's ``optim`` names: one table for the estimate (``--optimizer``) and this registry ---------------


class TrainerOptimizer:
    """An optimizer as the ``Trainer`` builds it for one ``optim`` name: its registered class and the options
    that change its state (``fused``, ``momentum``, bitsandbytes' ``optim_bits``)."""

    __slots__ = ("cls", "options", "embeddings_32bit")

    def __init__(self, cls: Union[type, str], options: dict | None = None, embeddings_32bit: bool = False) -> None:
        self.cls = cls
        self.options = dict(options or {})
        #: The Trainer's 8-bit bitsandbytes optimizers keep ``nn.Embedding`` weights' state in 32 bits.
        self.embeddings_32bit = embeddings_32bit

    def __repr__(self) -> str:
        return f"TrainerOptimizer({self.cls!r}, {self.options!r})"


def _bnb(name: str, bits: int) -> TrainerOptimizer:
    base = {"adamw": "Optimizer2State", "lion": "Optimizer1State", "rmsprop": "Optimizer1State"}.get(name)
    cls = "bitsandbytes.optim.ademamix.AdEMAMix" if base is None else f"bitsandbytes.optim.optimizer.{base}"
    return TrainerOptimizer(cls, {"optim_bits": bits}, embeddings_32bit=bits == 8)


#: The ``Trainer``'s ``optim`` names (``TrainingArguments.optim``) the estimate knows, and how each is built with
#: the default ``optim_args`` (paged optimizers hold the same state; paging moves it, it does not shrink it).
TRAINER_OPTIMIZERS: dict[str, TrainerOptimizer] = {
    "adamw_torch": TrainerOptimizer(torch.optim.AdamW),
    "adamw_torch_fused": TrainerOptimizer(torch.optim.AdamW, {"fused": True}),
    "adafactor": TrainerOptimizer("transformers.optimization.Adafactor", {"beta1": None}),
    "sgd": TrainerOptimizer(torch.optim.SGD, {"momentum": 0}),
    "rmsprop": TrainerOptimizer(torch.optim.RMSprop),
    "adamw_bnb_8bit": _bnb("adamw", 8),
    "adamw_8bit": _bnb("adamw", 8),
    "paged_adamw_8bit": _bnb("adamw", 8),
    "paged_adamw_32bit": _bnb("adamw", 32),
    "lion_8bit": _bnb("lion", 8),
    "lion_32bit": _bnb("lion", 32),
    "paged_lion_8bit": _bnb("lion", 8),
    "paged_lion_32bit": _bnb("lion", 32),
    "rmsprop_bnb": _bnb("rmsprop", 32),
    "rmsprop_bnb_8bit": _bnb("rmsprop", 8),
    "rmsprop_bnb_32bit": _bnb("rmsprop", 32),
    "ademamix": _bnb("ademamix", 32),
    "ademamix_8bit": _bnb("ademamix", 8),
    "paged_ademamix_8bit": _bnb("ademamix", 8),
    "paged_ademamix_32bit": _bnb("ademamix", 32),
}
#: The estimate's earlier names, still accepted.
LEGACY_OPTIMIZERS: dict[str, TrainerOptimizer] = {
    "adamw": TrainerOptimizer(torch.optim.AdamW),
    "adam": TrainerOptimizer(torch.optim.Adam),
    "sgd_momentum": TrainerOptimizer(torch.optim.SGD, {"momentum": 0.9}),
}


def optimizer_named(name: str) -> TrainerOptimizer:
    """The optimizer the ``Trainer`` builds for ``optim=name`` (or one of the estimate's earlier names)."""
    found = TRAINER_OPTIMIZERS.get(name) or LEGACY_OPTIMIZERS.get(name)
    if found is None:
        raise ValueError(f"optimizer must be one of {', '.join(TRAINER_OPTIMIZERS)} (the Trainer's optim names) "
                         f"or {', '.join(LEGACY_OPTIMIZERS)}; got {name!r}")
    return found


class _Planned:
    """A parameter not allocated: what the counts read (shape, numel, element size, device)."""

    def __init__(self, shape: tuple[int, ...], element_size: int, device: str) -> None:
        self.shape, self._element_size, self.device = torch.Size(shape), element_size, torch.device(device)

    def numel(self) -> int:
        return math.prod(self.shape)

    def element_size(self) -> int:
        return self._element_size

    def dim(self) -> int:
        return len(self.shape)


class _BitsAndBytesDefaults:
    """What bitsandbytes' ``get_config`` answers for a parameter of a Trainer-built optimizer: its defaults
    (``min_8bit_size`` 4096, no ``max_unorm``) and the Trainer's 32-bit override of embeddings."""

    def __init__(self, group: dict, bits: int) -> None:
        self.param_groups, self._bits = [group], bits

    def get_config(self, gindex: int, pindex: int, group: dict) -> dict:
        return {"optim_bits": self._bits, "min_8bit_size": 4096, "max_unorm": 0.0}


def planned_state_bytes(name: str, shape: tuple[int, ...], element_size: int, device: str,
                        embedding: bool = False) -> int:
    """Bytes the first step of the Trainer's ``optim=name`` allocates on ``device`` for one trainable parameter
    of ``shape`` and ``element_size``, counted by the same registered function as a live optimizer
    (``embedding``: the parameter is an ``nn.Embedding`` weight)."""
    spec = optimizer_named(name)
    state_bytes = _REGISTRY[spec.cls]
    parameter = _Planned(tuple(shape), element_size, device)
    group = {**spec.options, "params": [parameter]}
    optimizer: Any = None
    if "optim_bits" in spec.options:
        bits = 32 if embedding and spec.embeddings_32bit else spec.options["optim_bits"]
        optimizer = _BitsAndBytesDefaults(group, bits)
    return state_bytes(optimizer, group, parameter)


def like_parameter(name: str) -> tuple[int, int] | None:
    """(state tensors the size and dtype of the parameter, float32 scalars) of ``optim=name`` where its state is
    only that (torch's AdamW, Adam, SGD, ...: what a sharded estimate scales); None for other states."""
    spec = optimizer_named(name)
    state_bytes = _REGISTRY.get(spec.cls)
    if isinstance(state_bytes, functools.partial) and state_bytes.func is _like_parameter:
        buffers, scalars = state_bytes.args
        return buffers(spec.options), scalars
    return None
