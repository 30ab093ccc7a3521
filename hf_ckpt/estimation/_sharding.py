"""Per-device parameter, gradient and optimizer bytes under FSDP2 and DeepSpeed ZeRO, as the engines hold them.

The model is counted parameter by parameter on the meta device (shapes only); each engine's layout is modelled
from its code (torch 2.13's ``fully_shard``, DeepSpeed 0.19.8's ``stage_1_and_2.py`` / ``stage3.py`` and its
``DeepSpeedZeroConfig`` defaults):

* **FSDP2** (``fsdp-full``: ``reshard_after_forward=True``; ``fsdp-grad-op``: ``False``), one unit per block and
  the root (embeddings, final norm, head), as accelerate's and the Trainer's auto-wrap make them. Each parameter
  is split on dim 0 into ``world_size`` chunks padded to ``ceil(dim0 / world_size)`` rows; gradients and
  optimizer states (``torch.optim`` on the sharded DTensors, in the parameter dtype) are sharded alike. During
  the step the engine also holds, above the shards (unsharded units padded as the all-gather output is): the
  root unit unsharded from its forward to the end of
  backward (the root is not resharded after forward) with its unsharded gradients (reduce-scattered in the final
  callback), the current block and the one prefetched in backward, and the current block's unsharded gradients;
  with ``fsdp-grad-op`` every unit stays unsharded from its forward to its backward. ``offload_parameters``
  (``CPUOffloadPolicy``) moves the sharded parameters, gradients and the optimizer step to the host; FSDP has no
  optimizer-only offload. ``param_dtype`` (``MixedPrecisionPolicy(param_dtype=...)``): the shards, their gradients
  and the optimizer states stay in ``dtype`` (float32), each unit is all-gathered cast to ``param_dtype`` and its
  unsharded gradients are in it; the forward runs in it, inputs cast (the activations are traced in it).
* **ZeRO-1/2**: the trainable parameters are flattened into one ``dtype`` buffer padded to a multiple of
  ``2 * world_size`` elements, held whole on every rank; the optimizer runs on an fp32 master copy of this rank's
  partition (always cloned, also for float32 training), with fp32 optimizer states. ZeRO-2 keeps the gradients
  of the parameters overlapping this rank's partition, whole (``grads_in_partition``, in ``dtype``); ZeRO-1 keeps
  every gradient whole until the end of backward. One parameter group (the Trainer's two, decay and no decay,
  are partitioned each on its own: a few elements more). During backward both hold the gradient bucket
  (``reduce_bucket_size`` = 5e8 elements, in ``dtype``; released at the end of backward), and the step the fp32
  gradient of the partition.
* **ZeRO-3**: each parameter is partitioned to ``ceil(numel / world_size)`` elements; parameters of at most
  ``stage3_param_persistence_threshold`` (1e5) elements are also kept whole. The fp32 master partition exists
  unless the model trains in float32; gradients live in a flat partition buffer; the bucket (5e8 elements) is
  allocated at initialisation. Forward and backward gather the running module's parameters plus up to
  ``stage3_prefetch_bucket_size`` (5e7) prefetched elements, at most ``stage3_max_live_parameters`` (1e9).
  ``offload_optimizer`` moves master weights, optimizer states and the gradient partitions to the host;
  ``offload_parameters`` the parameter partitions.

``none`` is the single-device model (every device holds everything; DDP's buckets are not modelled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from hf_ckpt.meters.optimizer_states import like_parameter, optimizer_named
from hf_ckpt.estimation._states import count_states

#: The sharding strategies ``estimate(shard=...)`` and ``hf-ckpt estimate --shard`` accept.
NO_SHARD = "none"
SHARDS = (NO_SHARD, "fsdp-full", "fsdp-grad-op", "zero1", "zero2", "zero3")

#: DeepSpeed 0.19.8's ``DeepSpeedZeroConfig`` defaults, in elements.
REDUCE_BUCKET_SIZE = int(5e8)
PREFETCH_BUCKET_SIZE = int(5e7)
PARAM_PERSISTENCE_THRESHOLD = int(1e5)
MAX_LIVE_PARAMETERS = int(1e9)
#: ZeRO-1/2 pad the flat buffer to a multiple of ``NCCL_START_ALIGNMENT * world_size`` elements.
NCCL_START_ALIGNMENT = 2
_FP32 = 4


@dataclass(frozen=True)
class Sharding:
    """How the model's states are spread over devices.

    Attributes:
        world_size: Data-parallel devices the states are sharded over.
        shard: One of :data:`SHARDS`.
        offload_optimizer: ZeRO's ``offload_optimizer: {device: cpu}``.
        offload_parameters: ZeRO-3's ``offload_param: {device: cpu}``, or FSDP's ``CPUOffloadPolicy``.
        param_dtype: FSDP2's ``MixedPrecisionPolicy(param_dtype=...)``: what units are gathered and run in; None:
            the parameters' own dtype.
    """

    world_size: int = 1
    shard: str = "none"
    offload_optimizer: bool = False
    offload_parameters: bool = False
    param_dtype: torch.dtype | None = None

    @property
    def engine(self) -> str:
        """``"fsdp"``, ``"zero"`` or ``"none"``."""
        return "fsdp" if self.shard.startswith("fsdp") else "zero" if self.shard.startswith("zero") else "none"


@dataclass(frozen=True)
class DeviceStates:
    """Bytes one device (and its share of the host) holds for the model's states under a :class:`Sharding`.

    Attributes:
        parameters_bytes: Parameters held between steps (shards, and whatever the engine keeps whole).
        gradients_bytes: Gradients held from backward to the step (shards, or whole where the engine keeps them).
        optimizer_bytes: Optimizer states and master weights on the device.
        buffer_bytes: The engine's buffers kept between steps (ZeRO-3's gradient bucket).
        gather_bytes: The most held above the steady state during forward and backward (gathered units and their
            unsharded gradients, ZeRO-1/2's gradient bucket): part of the peak, not of the steady state.
        step_bytes: The most the optimizer step allocates on the device (ZeRO's fp32 gradient partition).
        host_bytes: Host memory this device's offloaded states take.
    """

    parameters_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    buffer_bytes: int = 0
    gather_bytes: int = 0
    step_bytes: int = 0
    host_bytes: int = 0

    @property
    def fixed_bytes(self) -> int:
        """What the device holds whatever the strategy: parameters, gradients, optimizer states, buffers."""
        return self.parameters_bytes + self.gradients_bytes + self.optimizer_bytes + self.buffer_bytes


@dataclass(frozen=True)
class _Param:
    numel: int
    rows: int
    size: int  # bytes per element
    trainable: bool
    unit: int  # -1: the root unit


def check_sharding(world_size: Any, shard: Any, offload_optimizer: Any, offload_parameters: Any,
                   param_dtype: torch.dtype | None = None) -> Sharding:
    """A :class:`Sharding` from ``estimate``'s arguments; ValueError naming the argument and what it accepts.
    ``param_dtype``: ``fsdp_param_dtype``, checked as a dtype already."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int; got {world_size!r}")
    name = shard.strip().lower().replace("_", "-") if isinstance(shard, str) else shard
    name = {"zero-1": "zero1", "zero-2": "zero2", "zero-3": "zero3", "full-shard": "fsdp-full",
            "shard-grad-op": "fsdp-grad-op"}.get(name, name)
    if name not in SHARDS:
        raise ValueError(f"shard must be one of {', '.join(SHARDS)}; got {shard!r}")
    for argument, value in (("offload_optimizer", offload_optimizer), ("offload_parameters", offload_parameters)):
        if not isinstance(value, bool):
            raise ValueError(f"{argument} must be True or False; got {value!r}")
    if name == NO_SHARD and (offload_optimizer or offload_parameters):
        raise ValueError("offload_optimizer / offload_parameters need a shard: zero1, zero2, zero3 (optimizer), "
                         "zero3 (parameters), fsdp-full or fsdp-grad-op (parameters); got shard='none'")
    if name.startswith("fsdp") and offload_optimizer:
        raise ValueError("offload_optimizer: FSDP offloads parameters, gradients and the optimizer step together; "
                         "use offload_parameters=True (--offload-parameters) with fsdp-full or fsdp-grad-op")
    if offload_parameters and name in ("zero1", "zero2"):
        raise ValueError(f"offload_parameters: DeepSpeed offloads parameters with zero3 only; got shard={name!r} "
                         "(zero1 and zero2 take offload_optimizer)")
    if param_dtype is not None and not name.startswith("fsdp"):
        raise ValueError(f"fsdp_param_dtype: FSDP2's mixed precision needs shard='fsdp-full' or 'fsdp-grad-op'; got "
                         f"shard={name!r}")
    return Sharding(world_size, name, offload_optimizer, offload_parameters, param_dtype)


def parameters_of(model: nn.Module, units: Sequence[nn.Module], receives_gradient: Callable[[str], bool]
                  ) -> list[_Param]:
    """Each distinct parameter of ``model``: size, rows, element size, whether it trains, and its unit."""
    unit_of = {id(p): index for index, unit in enumerate(units) for p in unit.parameters()}
    return [
        _Param(p.numel(), p.shape[0] if p.dim() else 1, p.element_size(),
               p.requires_grad and receives_gradient(name), unit_of.get(id(p), -1))
        for name, p in model.named_parameters()
    ]


def _fsdp_chunk(param: _Param, world_size: int) -> int:
    """Elements of one rank's padded dim-0 shard."""
    return math.ceil(param.rows / world_size) * (param.numel // max(param.rows, 1))


def _unit_bytes(params: Sequence[_Param], trainable_only: bool, world_size: int, size: int | None) -> dict[int, int]:
    """Bytes of each unit unsharded, as FSDP2's all-gather output holds them (every parameter padded on dim 0), in
    ``size`` bytes an element (the mixed-precision ``param_dtype``'s; None: each parameter's own)."""
    totals: dict[int, int] = {}
    for p in params:
        if p.trainable or not trainable_only:
            totals[p.unit] = totals.get(p.unit, 0) + _fsdp_chunk(p, world_size) * world_size * (size or p.size)
    return totals


def _fsdp(params: Sequence[_Param], sharding: Sharding, states: int, step_bytes: int) -> DeviceStates:
    ws = sharding.world_size
    shard_params = sum(_fsdp_chunk(p, ws) * p.size for p in params)
    shard_grads = sum(_fsdp_chunk(p, ws) * p.size for p in params if p.trainable)
    optimizer = states * shard_grads + step_bytes * sum(p.trainable for p in params)
    gathered = sharding.param_dtype.itemsize if sharding.param_dtype is not None else None
    unit_params, unit_grads = _unit_bytes(params, False, ws, gathered), _unit_bytes(params, True, ws, gathered)
    blocks = [b for u, b in unit_params.items() if u >= 0] or [0]
    block_grads = [b for u, b in unit_grads.items() if u >= 0] or [0]
    root = unit_params.get(-1, 0) + unit_grads.get(-1, 0)
    if sharding.shard == "fsdp-full":
        gather = root + 2 * max(blocks) + max(block_grads)
    else:
        gather = root + sum(blocks) + max(block_grads)
    if sharding.offload_parameters:
        return DeviceStates(0, 0, 0, gather_bytes=gather, host_bytes=shard_params + shard_grads + optimizer)
    return DeviceStates(shard_params, shard_grads, optimizer, gather_bytes=gather)


def _straddled(numels: Sequence[int], partition: int) -> int:
    """The most elements of whole parameters overlapping one rank's partition of the flat buffer: ZeRO-2's
    ``grads_in_partition`` holds each such parameter's gradient whole."""
    most, start = 0, 0
    while start < sum(numels):
        total, offset = 0, 0
        for n in numels:
            if offset < start + partition and offset + n > start:
                total += n
            offset += n
        most, start = max(most, total), start + partition
    return most


def _zero12(params: Sequence[_Param], sharding: Sharding, states: int, modules: Sequence[int]) -> DeviceStates:
    ws, align = sharding.world_size, NCCL_START_ALIGNMENT * sharding.world_size
    trained = [p for p in params if p.trainable]
    size = trained[0].size if trained else 2
    flat = math.ceil(sum(p.numel for p in trained) / align) * align
    partition = flat // ws
    frozen = sum(p.numel * p.size for p in params if not p.trainable)
    bucket = REDUCE_BUCKET_SIZE * size if trained else 0
    fp32_optimizer = (1 + states) * partition * _FP32  # master partition + states
    if sharding.offload_optimizer:  # grads go to the host's fp32 buffer through a largest-parameter staging buffer
        staging = max((p.numel for p in trained), default=0) * size
        host = fp32_optimizer + partition * _FP32 + partition * size
        return DeviceStates(flat * size + frozen, 0, 0, buffer_bytes=staging, gather_bytes=bucket, host_bytes=host)
    gradients = _straddled([p.numel for p in trained], partition) * size if sharding.shard == "zero2" else flat * size
    return DeviceStates(flat * size + frozen, gradients, fp32_optimizer, gather_bytes=bucket,
                        step_bytes=partition * _FP32)


def _zero3(params: Sequence[_Param], sharding: Sharding, states: int, modules: Sequence[int]) -> DeviceStates:
    ws = sharding.world_size
    trained = [p for p in params if p.trainable]
    size = params[0].size if params else 2
    partitions = sum(math.ceil(p.numel / ws) * p.size for p in params)
    persistent = sum(p.numel * p.size for p in params if p.numel <= PARAM_PERSISTENCE_THRESHOLD)
    trained_partition = sum(math.ceil(p.numel / ws) for p in trained)
    grads = trained_partition * size
    master = trained_partition * _FP32  # a copy also for float32 training (measured, DeepSpeed 0.19.8 on CPU)
    optimizer = master + states * trained_partition * _FP32
    bucket = REDUCE_BUCKET_SIZE * size if trained else 0
    gather = min(MAX_LIVE_PARAMETERS, max(modules, default=0) + PREFETCH_BUCKET_SIZE) * size
    step = 0 if size == _FP32 else min(trained_partition, int(1e9)) * _FP32
    host = 0
    if sharding.offload_optimizer:
        host += optimizer + grads + step
        optimizer = grads = step = 0
    if sharding.offload_parameters:
        host += partitions
        partitions = 0
    return DeviceStates(partitions + persistent, grads, optimizer, buffer_bytes=bucket, gather_bytes=gather,
                        step_bytes=step, host_bytes=host)


def module_sizes(model: nn.Module) -> list[int]:
    """Elements each module owns directly (what ZeRO-3 gathers when the module runs), modules without any left out."""
    sizes = []
    for module in model.modules():
        own = sum(p.numel() for p in module.parameters(recurse=False))
        if own:
            sizes.append(own)
    return sizes


def device_states(params: Sequence[_Param], sharding: Sharding, optimizer_states: int, step_bytes: int,
                  modules: Sequence[int]) -> DeviceStates | None:
    """The per-device states under ``sharding``; None for ``shard="none"`` (the single-device count stands).

    ``optimizer_states``: state tensors per parameter (AdamW 2); ``step_bytes``: bytes of ``torch.optim``'s step
    counter per parameter on the device (4 on the CPU, else 0); ``modules``: :func:`module_sizes`.
    """
    if sharding.shard == "none":
        return None
    if sharding.engine == "fsdp":
        return _fsdp(params, sharding, optimizer_states, step_bytes)
    if sharding.shard == "zero3":
        return _zero3(params, sharding, optimizer_states, modules)
    return _zero12(params, sharding, optimizer_states, modules)


@dataclass(frozen=True)
class PerDevice:
    """The states one device holds: the single-device count, or the sharded one (see :func:`shard_estimate`)."""

    sharding: Sharding
    whole: Any  # hf_ckpt.estimation._states.States: the whole model's states on one device
    sharded: DeviceStates | None
    #: The whole model's optimizer bytes as the engine keeps them (ZeRO: fp32 master weights and fp32 states, the
    #: per-device figure's definition); None: as ``whole`` counts them (the states in the parameters' dtype).
    engine_optimizer_bytes: int | None = None

    @property
    def parameters_bytes(self) -> int:
        return self.sharded.parameters_bytes if self.sharded else self.whole.parameters_bytes

    @property
    def gradients_bytes(self) -> int:
        return self.sharded.gradients_bytes if self.sharded else self.whole.gradients_bytes

    @property
    def optimizer_bytes(self) -> int:
        return self.sharded.optimizer_bytes if self.sharded else self.whole.optimizer_bytes

    @property
    def peak_fixed_bytes(self) -> int:
        """What every strategy's peak adds to its activations and transients."""
        if self.sharded is None:
            return self.parameters_bytes + self.gradients_bytes + self.optimizer_bytes
        return self.sharded.fixed_bytes + self.sharded.gather_bytes

    @property
    def step_peak_bytes(self) -> int:
        """The device during the optimizer step (activations freed): states, gradients, buffers and the step's
        temporaries."""
        if self.sharded is None:
            whole = self.whole
            return whole.parameters_bytes + whole.gradients_bytes + whole.optimizer_bytes + whole.step_bytes
        return self.sharded.fixed_bytes + self.sharded.step_bytes

    def fields(self) -> dict[str, Any]:
        """The :class:`~hf_ckpt.estimation.MemoryEstimate` fields that describe the sharding."""
        sharded = self.sharded or DeviceStates(0, 0, 0)
        return {
            "world_size": self.sharding.world_size, "shard": self.sharding.shard,
            "offload_optimizer": self.sharding.offload_optimizer,
            "offload_parameters": self.sharding.offload_parameters,
            "fsdp_param_dtype": _name(self.sharding.param_dtype),
            "buffer_bytes": sharded.buffer_bytes, "gather_bytes": sharded.gather_bytes,
            "step_bytes": sharded.step_bytes, "host_bytes": sharded.host_bytes,
            "model_parameters_bytes": self.whole.parameters_bytes,
            "model_gradients_bytes": self.whole.gradients_bytes,
            "model_optimizer_bytes": self.model_optimizer_bytes,
        }

    @property
    def model_optimizer_bytes(self) -> int:
        """The whole model's optimizer bytes, defined as the per-device figure is (summed over the shards, without
        their padding): ZeRO's fp32 master weights and fp32 states, else the states in the parameters' dtype."""
        return self.whole.optimizer_bytes if self.engine_optimizer_bytes is None else self.engine_optimizer_bytes


def _name(dtype: torch.dtype | None) -> str | None:
    return str(dtype).removeprefix("torch.") if dtype is not None else None


def shard_estimate(model: nn.Module, blocks: Sequence[Any], sharding: Sharding, optimizer: str, device: str,
                   receives_gradient: Callable[[str], bool], stored: dict[int, int] | None = None) -> PerDevice:
    """The states of ``model`` (on meta) on one device, whole and under ``sharding``; ``blocks`` are FSDP's units
    (each :class:`~hf_ckpt.runtime.blocks.Block`'s module); ``receives_gradient(name)``: the step reaches the
    parameter."""
    whole = count_states(model, optimizer, device, receives_gradient, stored)
    if sharding.shard == "none":
        return PerDevice(sharding, whole, None)
    params = parameters_of(model, [block.module for block in blocks], receives_gradient)
    states, scalars = _shardable(optimizer, sharding)
    on_device = device == "cpu" or bool(optimizer_named(optimizer).options.get("fused"))
    sharded = device_states(params, sharding, states, 4 * scalars if on_device else 0, module_sizes(model))
    engine_optimizer = None
    if sharding.engine == "zero":  # a master copy and the states, all fp32, of every trained parameter
        engine_optimizer = (1 + states) * sum(p.numel for p in params if p.trainable) * _FP32
    return PerDevice(sharding, whole, sharded, engine_optimizer)


def _shardable(optimizer: str, sharding: Sharding) -> tuple[int, int]:
    """(state tensors like the parameter, float32 scalars) of ``optimizer``; a sharded estimate scales only those."""
    found = like_parameter(optimizer)
    if found is None:
        raise ValueError(f"optimizer: {optimizer} under shard={sharding.shard!r} is not modelled (its state is not "
                         "tensors the size of the parameter); sharded estimates take adamw_torch, adamw_torch_fused, "
                         "rmsprop, sgd, adamw, adam or sgd_momentum")
    return found


def optimizer_definition(shard: str) -> str:
    """What an optimizer figure under ``shard`` counts, as the estimate prints it."""
    if shard.startswith("zero"):
        return "fp32 master weights and fp32 states, as DeepSpeed keeps them"
    return "states in the parameters' dtype, as torch.optim keeps them"
