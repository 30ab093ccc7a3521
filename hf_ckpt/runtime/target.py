"""The ``PreTrainedModel`` every public call acts on, whatever the user handed in.

Users pass the model they hold: a ``PreTrainedModel``, a PEFT ``PeftModel``, a model inside
``DistributedDataParallel`` or FSDP1, a DeepSpeed engine, a sentence-transformers model. Each kind of wrapper is
one *unwrapper*, registered with :func:`register_unwrapper`: a function that returns the module inside the wrapper,
or None when the object is not that kind of wrapper. :func:`target_model` peels wrappers until none applies, and
checks that a ``PreTrainedModel`` is left. Client integrations (``hf_ckpt.integrations``) register theirs without
this module knowing them, as PEFT registers its tuners.
"""

from __future__ import annotations

import sys
from typing import Callable

import torch
from torch import nn

from hf_ckpt.runtime.util.compat import peft_model_base
from hf_ckpt.runtime.extensions import register_unwrapper, unwrappers

Unwrapper = Callable[[nn.Module], "nn.Module | None"]


@register_unwrapper
def _peft(model: nn.Module) -> nn.Module | None:
    return peft_model_base(model)


@register_unwrapper
def _torch_engines(model: nn.Module) -> nn.Module | None:
    """DDP and FSDP1 keep the wrapped model as ``.module``; FSDP2 changes the class in place (nothing to peel)."""
    if not torch.distributed.is_available():
        return None
    wrappers: list[type] = [torch.nn.parallel.DistributedDataParallel]
    fsdp = sys.modules.get("torch.distributed.fsdp")  # only ever set when somebody imported FSDP
    if fsdp is not None and hasattr(fsdp, "FullyShardedDataParallel"):
        wrappers.append(fsdp.FullyShardedDataParallel)
    inner = getattr(model, "module", None)
    return inner if isinstance(model, tuple(wrappers)) and isinstance(inner, nn.Module) else None


def unwrap(model: nn.Module) -> nn.Module:
    """``model`` with every registered wrapper peeled off (``model`` itself when none applies)."""
    for _ in range(16):  # wrappers nest a few levels at most; a cycle must not hang
        for unwrapper in unwrappers():
            inner = unwrapper(model)
            if inner is not None and inner is not model:
                model = inner
                break
        else:
            return model
    return model


def target_model(model: nn.Module) -> nn.Module:
    """The ``PreTrainedModel`` to act on; TypeError naming what is accepted when there is none."""
    from transformers import PreTrainedModel

    target = unwrap(model)
    if not isinstance(target, PreTrainedModel):
        raise TypeError(
            "model must be a transformers PreTrainedModel, or a wrapper of one (PEFT PeftModel, "
            "DistributedDataParallel, FSDP, DeepSpeed engine, SentenceTransformer); "
            f"got {type(model).__name__}"
        )
    return target
