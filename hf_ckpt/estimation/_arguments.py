"""Validation of ``estimate``'s arguments, at the call: each error names the argument and what it accepts."""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch
from torch import nn

from hf_ckpt.meters.optimizer_states import optimizer_named
from hf_ckpt.runtime.plans import CheckpointPlan
from hf_ckpt.runtime.util.dtype_names import DTYPE_NAMES, dtype_name
from hf_ckpt.estimation._attention import DEVICES
from hf_ckpt.strategies import ALL_STRATEGIES

STRATEGY_FORMS = "none, full, selective, every_n:K (K a positive int) or a hf_ckpt.CheckpointPlan"


def check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False; got {value!r}")
    return value


def check_dtype(value: Any) -> torch.dtype:
    if isinstance(value, torch.dtype) and str(value).removeprefix("torch.") in DTYPE_NAMES:
        return value
    name = dtype_name(value) if isinstance(value, str) else None
    if name is not None:
        return getattr(torch, name)
    raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)} (or bf16, fp16, fp32, or the torch dtype); got {value!r}")


def _lower_precision(name: str, value: Any) -> torch.dtype | None:
    """None, or bfloat16 / float16 (any spelling :func:`check_dtype` takes); ValueError naming ``name`` otherwise."""
    if value is None:
        return None
    try:
        dtype = check_dtype(value)
    except ValueError:
        dtype = None
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"{name} must be None, bfloat16 or float16 (or bf16, fp16, or the torch dtype); got {value!r}")
    return dtype


def check_autocast(value: Any) -> torch.dtype | None:
    """None (no autocast) or the lower precision autocast runs matmuls in: bfloat16 or float16."""
    return _lower_precision("autocast", value)


def check_fsdp_param_dtype(value: Any, autocast: torch.dtype | None) -> torch.dtype | None:
    """None, or the lower precision FSDP2's ``MixedPrecisionPolicy(param_dtype=...)`` gathers and computes in."""
    dtype = _lower_precision("fsdp_param_dtype", value)
    if dtype is not None and autocast is not None:
        raise ValueError("fsdp_param_dtype: FSDP2's mixed precision runs the forward in it already; leave autocast "
                         "None")
    return dtype


def check_device(value: Any) -> str:
    kind = value.type if isinstance(value, torch.device) else value
    if isinstance(kind, str) and kind.split(":")[0] in DEVICES:
        return kind.split(":")[0]
    raise ValueError(f"device must be one of {', '.join(DEVICES)}; got {value!r}")


def check_optimizer(value: Any) -> str:
    """A ``Trainer`` ``optim`` name (or an earlier estimate name), lower-cased."""
    try:
        optimizer_named(value.lower() if isinstance(value, str) else None)
    except ValueError as error:  # the message names the accepted values; the value as given
        raise ValueError(f"{str(error).rsplit('; got ', 1)[0]}; got {value!r}") from None
    return value.lower()


def check_peft_config(value: Any) -> Any:
    if value is None:
        return None
    try:
        from peft import PeftConfig
    except ImportError:  # pragma: no cover - peft is an optional dependency
        raise ValueError("peft_config needs the peft package (pip install peft)") from None
    if not isinstance(value, PeftConfig):
        raise ValueError(f"peft_config must be a peft.PeftConfig (e.g. peft.LoraConfig) or None; got {type(value).__name__}")
    return value


def strategy_name(strategy: Any) -> str:
    return "plan" if isinstance(strategy, CheckpointPlan) else strategy


def check_strategies(value: Any) -> tuple[Any, ...]:
    if isinstance(value, (str, CheckpointPlan)) or not isinstance(value, Sequence) or not value:
        raise ValueError(f"strategies must be a non-empty list or tuple of {STRATEGY_FORMS}; got {value!r}")
    checked: list[Any] = []
    for strategy in value:
        if isinstance(strategy, CheckpointPlan):
            checked.append(strategy)
            continue
        if isinstance(strategy, str):
            spelled = strategy.strip()
            if spelled in ALL_STRATEGIES:
                checked.append(spelled)
                continue
            if spelled.startswith("every_n:"):
                argument = spelled.split(":", 1)[1]
                if argument.isdigit() and int(argument) >= 1:
                    checked.append(f"every_n:{int(argument)}")
                    continue
        raise ValueError(f"strategies: each must be {STRATEGY_FORMS}; got {strategy!r}")
    names = [strategy_name(s) for s in checked]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"strategies must not repeat; {', '.join(repeated)} appears more than once")
    return tuple(checked)


def check_source(value: Any) -> Any:
    from transformers import PretrainedConfig

    if isinstance(value, (PretrainedConfig, nn.Module)):
        if isinstance(value, nn.Module):
            placed = {p.device.type for p in value.parameters()}
            if placed - {"meta"}:
                raise ValueError(
                    "model_or_config: a model must be on the meta device (build it under "
                    f"`with torch.device('meta'):`); got parameters on {', '.join(sorted(placed - {'meta'}))}"
                )
        return value
    if isinstance(value, (str, os.PathLike)):
        return value
    raise ValueError(
        "model_or_config must be a transformers PretrainedConfig, a path to a config.json (or its folder), or a "
        f"model on the meta device; got {type(value).__name__}"
    )
