"""The sharding a training run uses, read from accelerate's state (the ``Trainer`` and ``accelerate launch`` set it),
as :func:`~hf_ckpt.estimation.estimate`'s keywords; and what a ``"auto"`` budget must leave for the sharded states.

Read from the initialized ``AcceleratorState`` when accelerate has been imported (never importing it): its
``distributed_type`` (``FSDP`` or ``DEEPSPEED``), the FSDP plugin (``fsdp_version``, ``reshard_after_forward`` /
the FSDP1 sharding strategy, ``cpu_offload``) or the DeepSpeed plugin (the config's ``zero_optimization``:
``stage``, ``offload_optimizer``, ``offload_param``), and the number of processes. Anything else (DDP, one
process, accelerate not in use) is ``{}``: the single-device estimate.
"""

from __future__ import annotations

import sys
from typing import Any

from hf_ckpt.runtime.util.units import format_bytes

#: FSDP1 sharding strategies (by name or enum value) -> ``shard``.
_FSDP1 = {"FULL_SHARD": "fsdp-full", "SHARD_GRAD_OP": "fsdp-grad-op", "HYBRID_SHARD": "fsdp-full",
          "_HYBRID_SHARD_ZERO2": "fsdp-grad-op", "1": "fsdp-full", "2": "fsdp-grad-op", "4": "fsdp-full",
          "5": "fsdp-grad-op"}


def _shared(class_name: str) -> dict:
    module = sys.modules.get("accelerate.state")
    shared = getattr(getattr(module, class_name, None), "_shared_state", None)
    return shared if isinstance(shared, dict) else {}


def _fsdp(plugin: Any) -> dict[str, Any] | None:
    reshard = getattr(plugin, "reshard_after_forward", True)
    if getattr(plugin, "fsdp_version", 1) == 2 or isinstance(reshard, bool):
        shard = "fsdp-full" if reshard else "fsdp-grad-op"
    else:
        name = getattr(reshard, "name", str(reshard)).upper().removeprefix("SHARDINGSTRATEGY.")
        shard = _FSDP1.get(name)
        if shard is None:  # NO_SHARD: every rank holds everything, as DDP
            return None
    offload = getattr(plugin, "cpu_offload", False)
    kind = type(offload).__name__  # FSDP2: CPUOffloadPolicy or OffloadPolicy (none); FSDP1: CPUOffload
    offloaded = kind == "CPUOffloadPolicy" if kind.endswith("OffloadPolicy") else bool(
        getattr(offload, "offload_params", offload))
    return {"shard": shard, "offload_parameters": offloaded}


def _deepspeed(plugin: Any) -> dict[str, Any] | None:
    config = getattr(getattr(plugin, "hf_ds_config", None), "config", None) or getattr(plugin, "deepspeed_config", {})
    zero = config.get("zero_optimization", {}) if isinstance(config, dict) else {}
    stage = zero.get("stage", getattr(plugin, "zero_stage", 0))
    if not isinstance(stage, int) or stage not in (1, 2, 3):
        return None

    def device(key: str, attribute: str) -> bool:
        found = zero.get(key, {}).get("device") if isinstance(zero.get(key), dict) else getattr(plugin, attribute, None)
        return found in ("cpu", "nvme")

    return {"shard": f"zero{stage}", "offload_optimizer": device("offload_optimizer", "offload_optimizer_device"),
            "offload_parameters": stage == 3 and device("offload_param", "offload_param_device")}


def detected_sharding() -> dict[str, Any]:
    """``world_size``, ``shard`` and the offload flags of the run accelerate set up; ``{}`` without sharding."""
    accelerator = _shared("AcceleratorState")
    kind = str(getattr(accelerator.get("distributed_type", _shared("PartialState").get("distributed_type")), "value",
                       accelerator.get("distributed_type", "")))
    world_size = _shared("PartialState").get("num_processes") or accelerator.get("num_processes") or 1
    found = None
    if kind == "FSDP" and accelerator.get("fsdp_plugin") is not None:
        found = _fsdp(accelerator["fsdp_plugin"])
    elif kind == "DEEPSPEED":
        plugins = accelerator.get("deepspeed_plugins") or {}
        plugin = next(iter(plugins.values()), None) if isinstance(plugins, dict) else plugins
        found = _deepspeed(plugin or accelerator.get("deepspeed_plugin"))
    if found is None or not isinstance(world_size, int) or world_size < 2:
        return {}
    return {"world_size": world_size, **found}


def still_allocated(made: Any) -> tuple[int, str]:
    """(bytes, what): the states the step still allocates on the device when the first batch arrives, for
    ``"auto"``: without sharding, the gradients and the optimizer states (the parameters are already there);
    under FSDP the sharded gradients, optimizer states and what it gathers; DeepSpeed allocates its master
    weights, optimizer states (and ZeRO-3 its gradient partitions and bucket) in ``deepspeed.initialize``, so
    what is left is what it gathers and, for ZeRO-1/2, the gradients and the bucket of the first backward."""
    if made.shard == "none":
        return made.gradients_bytes + made.optimizer_bytes, (
            f"gradients {format_bytes(made.gradients_bytes)}, optimizer states {format_bytes(made.optimizer_bytes)}")
    if made.shard.startswith("fsdp"):
        parts = {"gradients": made.gradients_bytes, "optimizer states": made.optimizer_bytes,
                 "gathered units": made.gather_bytes}
    elif made.shard == "zero3":
        parts = {"gathered parameters": made.gather_bytes}
    else:
        parts = {"gradients": made.gradients_bytes, "gradient bucket": made.gather_bytes}
    where = f"{made.shard} over {made.world_size}"
    return sum(parts.values()), f"{where}: " + ", ".join(f"{k} {format_bytes(v)}" for k, v in parts.items())
