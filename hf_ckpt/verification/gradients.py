"""Parameter groups and gradient parity: the gradients of a step with checkpointing against one without."""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from hf_ckpt.runtime.util.compat import peft_model_base
from hf_ckpt.runtime.blocks import find_blocks
from hf_ckpt.verification.report import GradientParity

#: Default ``rtol`` by the precision of a group's gradients: fp32/fp64 gradients of the two steps agree to rounding;
#: half-precision ones may differ by a few units in the last place where kernels are nondeterministic.
_DEFAULT_RTOL_FULL = 1e-3
_DEFAULT_RTOL_HALF = 2e-2
_HALF_DTYPES = (torch.float16, torch.bfloat16)


def parameter_groups(model: nn.Module) -> dict[str, str]:
    """The gradient-parity group of every parameter of ``model``, by parameter name.

    * ``"block <i>"``: the parameters inside block ``i`` (:func:`hf_ckpt.runtime.blocks.find_blocks` order, adapters such as
      LoRA weights included);
    * ``"embeddings"``: the input embeddings and every other ``nn.Embedding`` outside the blocks (positions,
      token types);
    * ``"head"``: the output embeddings (the LM head), unless tied to the input embeddings;
    * ``"other"``: everything else outside the blocks (final norms, poolers, ...).
    """
    base = peft_model_base(model)
    target = base if base is not None else model
    group_of: dict[int, str] = {}
    for block in find_blocks(target):
        for parameter in block.module.parameters():
            group_of.setdefault(id(parameter), f"block {block.index}")
    embeddings = [_call_or_none(target, "get_input_embeddings")]
    embeddings += [m for m in target.modules() if isinstance(m, nn.Embedding)]
    for module in embeddings:
        for parameter in module.parameters() if isinstance(module, nn.Module) else ():
            group_of.setdefault(id(parameter), "embeddings")
    head = _call_or_none(target, "get_output_embeddings")
    for parameter in head.parameters() if isinstance(head, nn.Module) else ():
        group_of.setdefault(id(parameter), "head")
    return {name: group_of.get(id(parameter), "other") for name, parameter in model.named_parameters()}


def _call_or_none(model: nn.Module, method: str) -> Any:
    try:
        return getattr(model, method)()
    except (AttributeError, NotImplementedError):
        return None


def _group_order(group: str) -> tuple[int, int]:
    if group == "embeddings":
        return (0, 0)
    if group.startswith("block "):
        return (1, int(group.split()[1]))
    return (2, 0) if group == "other" else (3, 0)


def compare_gradients(
    groups: Mapping[str, str],
    checkpointed: Mapping[str, torch.Tensor],
    reference: Mapping[str, torch.Tensor],
    rtol: float | None,
    atol: float,
) -> list[GradientParity]:
    """Gradient parity of the two steps' gradients (by parameter name), one entry per group, in model order."""
    members: dict[str, list[str]] = {}
    for name in groups:
        if name in checkpointed or name in reference:
            members.setdefault(groups[name], []).append(name)
    result = []
    for group in sorted(members, key=_group_order):
        names = members[group]
        missing = tuple(name for name in names if (name in checkpointed) != (name in reference))
        both = [name for name in names if name in checkpointed and name in reference]
        max_abs = max((float((checkpointed[n].float() - reference[n].float()).abs().max()) for n in both), default=0.0)
        reference_max = max((float(reference[n].float().abs().max()) for n in both), default=0.0)
        if rtol is None:
            half = any(reference[n].dtype in _HALF_DTYPES for n in both)
            group_rtol = _DEFAULT_RTOL_HALF if half else _DEFAULT_RTOL_FULL
        else:
            group_rtol = rtol
        result.append(GradientParity(group, len(names), max_abs, reference_max, group_rtol, atol, missing))
    return result
