"""The sequence-chunked MLP (``mlp_chunk_size``): each block's MLP runs over the tokens in chunks of ``N``, each chunk
checkpointed (non-reentrant), so only one chunk's intermediate activations (``N x intermediate_size`` values per
tensor) are alive at once, in the forward and in the recompute of a checkpointed block alike. The block's norms (its
children that normalise each token over the hidden size: ``LayerNorm``, ``RMSNorm``) run the same way, so their
float32 intermediates (two or three ``seq x hidden`` float32 tensors each under bf16) are a chunk's too; their
outputs, which the attention and the MLP read whole, are not chunked.

**Which module.** The MLP of a block is its child named ``mlp``, ``feed_forward`` or ``ffn`` (the first found, in that
order; Llama, Qwen2, Mistral, GPT-2, Falcon, ...). A block without one, or whose MLP is not position-wise, is refused
at the call: an MLP that routes tokens to experts (a submodule called ``gate``/``router``/``experts`` or a class named
like a router, expert or MoE: the router's auxiliary loss and any capacity limit depend on the whole sequence), that
mixes positions (a convolution with a kernel wider than 1, a padding/shift module: RWKV's ``time_shift``), or whose
forward needs more than the hidden states.

**How, without touching ``forward``.** Two hooks on the MLP, recorded in the state's hooks (removed by ``disable``,
taken off and put back by ``suspended``): a forward pre-hook keeps the hidden states and hands the MLP's own call an
empty slice of them (no tokens: the call costs nothing), and a forward hook returns, in place of that empty output,
the MLP's ``forward`` run over the kept hidden states in checkpointed chunks (all tokens of the batch in order,
``batch x seq`` flattened, ``N`` at a time). Nothing is assigned or deleted on any module, so the module tree,
``state_dict`` keys and PEFT's module names are unchanged; other hooks on the MLP run once per call around it (those
registered before hf_ckpt's see the full input and the empty output, those after it the empty input and the full
output). Under ``no_grad`` (``eval``, ``generate``) and where the tokens fit in one chunk, the MLP runs unchunked, as
without the setting. Dropout inside the MLP draws its mask per chunk (same distribution, another random stream).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hf_ckpt.runtime.blocks import find_blocks
from hf_ckpt.runtime.state import CheckpointState

#: The names a block's MLP child goes by, looked up in this order.
MLP_NAMES = ("mlp", "feed_forward", "ffn")

_ROUTED_NAMES = ("gate", "router", "experts")
_ROUTED_CLASS = re.compile(r"router|expert|moe", re.IGNORECASE)
_HOOK_GROUP = "mlp-chunks"
_TORCH_RMS_NORM = (nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()  # torch >= 2.4
_CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def find_mlp(block: nn.Module) -> tuple[str, nn.Module] | None:
    """``(name, module)`` of ``block``'s MLP child (:data:`MLP_NAMES`), or None."""
    children = dict(block.named_children())
    return next(((name, children[name]) for name in MLP_NAMES if isinstance(children.get(name), nn.Module)), None)


def _not_position_wise(mlp: nn.Module) -> str | None:
    """Why ``mlp`` is not position-wise (its output at a token depends on other tokens), or None."""
    for name, module in mlp.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in _ROUTED_NAMES or _ROUTED_CLASS.search(type(module).__name__):
            where = f"{name} ({type(module).__name__})" if name else type(module).__name__
            return (f"it routes tokens to experts ({where}): a router's auxiliary loss and capacity depend on the "
                    "whole sequence")
        kernel = getattr(module, "kernel_size", None) if isinstance(module, _CONVOLUTIONS) else None
        if (kernel is not None and any(k > 1 for k in kernel)) or "Pad" in type(module).__name__:
            return (f"it mixes positions along the sequence ({name}: {type(module).__name__}), so a chunk's output "
                    "depends on the tokens of other chunks")
    try:
        parameters = list(inspect.signature(mlp.forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return "the signature of its forward cannot be read"
    needed = [p.name for p in parameters if p.default is inspect.Parameter.empty
              and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if needed:
        return f"its forward needs more than the hidden states ({', '.join(needed)})"
    return None


def refusal(target: nn.Module) -> str | None:
    """Why ``mlp_chunk_size`` cannot apply to ``target``, or None where it can (every block has a position-wise MLP)."""
    blocks = find_blocks(target)
    if not blocks:
        return "it has no repeated blocks"
    for block in blocks:
        found = find_mlp(block.module)
        if found is None:
            return (f"block {block.index} ({block.name}: {type(block.module).__name__}) has no MLP child named "
                    f"{', '.join(MLP_NAMES[:-1])} or {MLP_NAMES[-1]}")
        why = _not_position_wise(found[1])
        if why is not None:
            return f"the MLP of block {block.index} ({block.name}.{found[0]}: {type(found[1]).__name__}) is not position-wise: {why}"
    return None


def mlps(target: nn.Module) -> list[nn.Module]:
    """Every block's MLP, in block order (after :func:`refusal` said None)."""
    return [find_mlp(block.module)[1] for block in find_blocks(target)]


def _position_wise_norm(module: nn.Module) -> bool:
    """Whether ``module`` normalises each token over the last dimension alone: ``nn.LayerNorm``/``nn.RMSNorm`` over
    one dimension, or a class named ``...LayerNorm``/``...RMSNorm`` whose weight (if any) is one vector (Llama's,
    Gemma's, T5's norms). Group and batch norms mix tokens and are left alone."""
    shape = getattr(module, "normalized_shape", None)
    if shape is not None and isinstance(module, (nn.LayerNorm, *_TORCH_RMS_NORM)):
        return len(shape) == 1
    if not type(module).__name__.endswith(("LayerNorm", "RMSNorm")):
        return False
    weight = getattr(module, "weight", None)
    return weight is None or (isinstance(weight, torch.Tensor) and weight.dim() == 1)


def norms(target: nn.Module) -> list[nn.Module]:
    """Every block's position-wise norms (its direct children; :func:`_position_wise_norm`), in block order."""
    return [child for block in find_blocks(target) for child in block.module.children() if _position_wise_norm(child)]


def _chunk(mlp: nn.Module, states: torch.Tensor) -> torch.Tensor:
    return mlp.forward(states)


def chunked(mlp: nn.Module, hidden: torch.Tensor, size: int, preserve_rng_state: bool = True) -> torch.Tensor:
    """``mlp.forward(hidden)`` over ``size`` tokens at a time (batch and sequence flattened), each chunk checkpointed
    (``preserve_rng_state=False`` where the module draws no random numbers: a norm; each chunk would keep a copy of
    the CPU generator's state, 5 KB, until backward)."""
    flat = hidden.reshape(1, -1, hidden.shape[-1])
    outputs = []
    for start in range(0, flat.shape[1], size):
        out = checkpoint(_chunk, mlp, flat[:, start:start + size], use_reentrant=False,
                         preserve_rng_state=preserve_rng_state)
        if not isinstance(out, torch.Tensor):
            raise RuntimeError(f"mlp_chunk_size: {type(mlp).__name__} returned {type(out).__name__}, not one tensor")
        outputs.append(out)
    return torch.cat(outputs, dim=1).reshape(*hidden.shape[:-1], outputs[0].shape[-1])


def _hooks(size: int, preserve_rng_state: bool = True) -> tuple[Any, Any]:
    """The pre-hook and hook of one MLP (or norm): ``size`` tokens per chunk."""
    kept: list[torch.Tensor | None] = [None]

    def before(module: nn.Module, args: tuple, kwargs: dict) -> Any:
        kept[0] = None
        hidden = args[0] if args else next(iter(kwargs.values()), None)
        if not torch.is_grad_enabled() or not isinstance(hidden, torch.Tensor) or hidden.dim() < 2:
            return None
        if hidden[..., 0].numel() <= size:  # one chunk: nothing to save
            return None
        kept[0] = hidden
        empty = hidden[..., :0, :]
        if args:
            return (empty, *args[1:]), kwargs
        first = next(iter(kwargs))
        return args, {**kwargs, first: empty}

    def after(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        hidden, kept[0] = kept[0], None
        if hidden is None:
            return None
        if not isinstance(output, torch.Tensor):
            raise RuntimeError(f"mlp_chunk_size: {type(module).__name__} returned {type(output).__name__}, not one "
                               "tensor; drop mlp_chunk_size for this model")
        return chunked(module, hidden, size, preserve_rng_state)

    return before, after


def install(state: CheckpointState, target: nn.Module) -> None:
    """Hook every block's MLP and norms of ``target`` so that they run in chunks of ``state.config.mlp_chunk_size``
    tokens with grad enabled; the hooks are the record's (group ``"mlp-chunks"``)."""
    size = state.config.mlp_chunk_size
    for module, random in [(mlp, True) for mlp in mlps(target)] + [(norm, False) for norm in norms(target)]:
        before, after = _hooks(size, preserve_rng_state=random)
        state.hooks.add(module, "register_forward_pre_hook", before, group=_HOOK_GROUP, with_kwargs=True)
        state.hooks.add(module, "register_forward_hook", after, group=_HOOK_GROUP, with_kwargs=True)
