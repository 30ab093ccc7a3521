"""The chunked, checkpointed head (``head_chunk_size``). In a training forward with grad and ``labels``, a causal
LM's own forward runs with ``labels=None`` while a pre-hook hands its output projection an empty slice of the hidden
states (taken for the loss), so no full logits are made; the loss is the model's own loss function over chunks of
tokens, each chunk checkpointed (its logits freed once its share is taken, recomputed in backward), labels shifted
as it shifts them, shares divided by ``num_items_in_batch`` (or the labelled tokens: its mean), plus a MoE router's
auxiliary loss. The output class comes back with ``loss`` and ``logits=None``; other calls run as without it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hf_ckpt.runtime.state import CheckpointState, get_state
from hf_ckpt.runtime.warn import warn_once

_AUX = "router_aux_loss_coef"

#: The keyword arguments of a forward that change its loss, when the forward hands them to ``self.loss_function``.
_LOSS_KWARGS = ("num_items_in_batch", "ignore_index", "shift_labels")


#: The fewest tokens a chunk has by default (or the sequence length, where shorter): below it, the chunks' Python
#: and kernel-launch overhead costs step time (8-token chunks ran 8x slower than 128-token ones on a CPU) for
#: little memory.
CHUNK_FLOOR = 128


def default_chunk_size(tokens: int, seq_len: int, hidden: int, vocab: int, *, floor: bool = True) -> int:
    """The chunk (tokens) the estimator and both planners use when none is given: the tokens whose logits hold about
    as many values as the step's hidden states (``tokens / ceil(vocab / hidden)``, up to a power of two), but no
    fewer than :data:`CHUNK_FLOOR` tokens or ``seq_len`` where shorter (``floor=False``: the memory rule alone), and
    never more than ``tokens``."""
    per_chunk = -(-tokens // max(1, -(-vocab // hidden)))
    chunk = 1 << (per_chunk - 1).bit_length()
    if floor:
        chunk = max(chunk, min(CHUNK_FLOOR, seq_len))
    return min(tokens, chunk)


def default_chunk_of(config: Any, batch_size: int, seq_len: int, *, floor: bool = True) -> int | None:
    """:func:`default_chunk_size` for a model of ``config`` (its text config's ``hidden_size`` and ``vocab_size``)
    at ``batch_size`` x ``seq_len``; None where the config has no such sizes."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab, hidden = getattr(text, "vocab_size", None), getattr(text, "hidden_size", None)
    if not isinstance(vocab, int) or not isinstance(hidden, int) or hidden < 1:
        return None
    return default_chunk_size(batch_size * seq_len, seq_len, hidden, vocab, floor=floor)


def _assigned(tree: ast.AST, name: str) -> list[ast.stmt]:
    """The statements of ``tree`` that assign to the variable ``name``."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
            and any(isinstance(t, ast.Name) and t.id == name
                    for t in getattr(node, "targets", [getattr(node, "target", None)]))]


@functools.lru_cache(maxsize=None)
def _loss_calls(cls: type) -> tuple[ast.AST, list[ast.Call]] | None:
    """``cls.forward``'s syntax tree and its ``self.loss_function(...)`` calls; None where its source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.forward)))
    except (OSError, TypeError, SyntaxError):
        return None
    return tree, [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "self.loss_function"]


def _forward_refusal(target: nn.Module, head_name: str) -> str | None:
    """Why ``target``'s forward does not compute ``self.loss_function(<its head's logits>)``, or None."""
    parsed = _loss_calls(type(target))
    if parsed is None:
        return "the source of its forward cannot be read, so how it computes its loss is unknown"
    tree, calls = parsed
    if len(calls) != 1:
        return "its forward does not compute its loss with self.loss_function (it computes it its own way)"
    for keyword in calls[0].keywords:
        given = ast.unparse(keyword.value) if keyword.arg in _LOSS_KWARGS else None
        if given is not None and given not in (keyword.arg, f"kwargs.get('{keyword.arg}')", f"kwargs['{keyword.arg}']"):
            return (f"its forward hands its loss function {keyword.arg}={given}, which the chunked head does not "
                    "reproduce")
    logits = calls[0].args[0] if calls[0].args else next((k.value for k in calls[0].keywords if k.arg == "logits"), None)
    made = _assigned(tree, logits.id) if isinstance(logits, ast.Name) else []
    value = made[0].value if len(made) == 1 else None
    while (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and not value.args
           and value.func.attr in ("float", "contiguous")):
        value = value.func.value  # the loss upcasts the logits itself; a contiguous copy holds the same values
    if not isinstance(value, ast.Call) or ast.unparse(value.func) != f"self.{head_name}":
        return (f"its forward does not hand the output of self.{head_name} to its loss unchanged (logit "
                "soft-capping or scaling), so the chunked head would compute a different loss")
    loss = next((s.targets[0].id for s in ast.walk(tree) if isinstance(s, ast.Assign)
                 and isinstance(s.targets[0], ast.Name) and calls[0] in ast.walk(s.value)), None)
    for step in _assigned(tree, loss) if loss else []:
        if calls[0] in ast.walk(step.value) or (isinstance(step.value, ast.Constant) and step.value.value is None):
            continue
        if not (isinstance(step, ast.AugAssign) and _AUX in ast.unparse(step.value) and hasattr(target, _AUX)):
            return f"its forward changes the loss after self.loss_function ({ast.unparse(step)})"
    return None


@functools.lru_cache(maxsize=None)
def _forwarded(cls: type) -> frozenset[str]:
    """Which of :data:`_LOSS_KWARGS` ``cls.forward`` hands to ``self.loss_function``: all with ``**kwargs``, else
    those it names (Bloom on 5.15 names ``num_items_in_batch`` alone, XGLM none). What it does not hand on, its
    loss ignores, and so does the chunked head's (a forward whose source cannot be read was refused at the call)."""
    _, calls = _loss_calls(cls)
    keywords = [keyword.arg for call in calls for keyword in call.keywords]
    return frozenset(_LOSS_KWARGS) if None in keywords else frozenset(k for k in keywords if k in _LOSS_KWARGS)


def refusal(target: nn.Module) -> str | None:
    """Why ``head_chunk_size`` cannot apply to ``target``, or None where it can."""
    head = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
    head_name = next((name for name, child in target.named_children() if child is head), None)
    if head is None or head_name is None:
        return "it has no output projection of its own (get_output_embeddings() is not one of its submodules)"
    if not isinstance(getattr(type(target), "loss_function", None), property):
        return "it computes its loss its own way (this transformers release has no PreTrainedModel.loss_function)"
    if "shift_labels" not in inspect.signature(target.loss_function).parameters:
        return f"its loss function {getattr(target.loss_function, '__name__', '?')} takes no shift_labels"
    return _forward_refusal(target, head_name)


def _loss(target: nn.Module, head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor, size: int,
          kwargs: dict[str, Any]) -> torch.Tensor:
    """The model's loss over ``hidden`` (the head's input), ``size`` tokens at a time, each chunk checkpointed."""
    kwargs = {name: value for name, value in kwargs.items() if name in _forwarded(type(target))}
    ignore = kwargs.get("ignore_index", -100)
    shifted = kwargs.get("shift_labels")
    if shifted is None:
        shifted = nn.functional.pad(labels, (0, 1), value=ignore)[..., 1:]
    shifted = shifted.reshape(-1).to(hidden.device)
    hidden = hidden.reshape(-1, hidden.shape[-1])
    count = kwargs.get("num_items_in_batch")
    count = (shifted != ignore).sum() if count is None else count
    loss_function = target.loss_function

    def chunk(states: torch.Tensor, chunk_labels: torch.Tensor) -> torch.Tensor:
        logits = head(states)
        return loss_function(logits, None, logits.shape[-1], num_items_in_batch=count, ignore_index=ignore,
                             shift_labels=chunk_labels)

    return sum(checkpoint(chunk, hidden[i:i + size], shifted[i:i + size], use_reentrant=False)
               for i in range(0, shifted.numel(), size))


def _labels_by_position(forward: Any, args: tuple) -> bool:
    """Whether ``args`` (a forward's positional arguments) reach its ``labels`` parameter."""
    names = list(inspect.signature(forward).parameters)
    return "labels" in names and len(args) > names.index("labels")


def _forward(target: nn.Module, forward: Any, *args: Any, **kwargs: Any) -> Any:
    state, labels = get_state(target), kwargs.get("labels")
    size = state.config.head_chunk_size if state is not None else None  # read now: a budget plans in a pre-hook
    if size is None or labels is None or not target.training or not torch.is_grad_enabled():
        if size is not None and labels is None and args and _labels_by_position(forward, args):
            warn_once(f"head_chunk_size={size} does not take effect: {type(target).__name__} was given its labels by "
                      "position, and the chunked head reads them by keyword (labels=...); this step computes the "
                      "full logits", key="head-chunk-positional-labels", owner=target)
        return forward(*args, **kwargs)
    head, taken = target.get_output_embeddings(), []

    def take(module: nn.Module, inputs: tuple) -> tuple:
        taken.append(inputs[0])
        return (inputs[0][..., :0, :], *inputs[1:])

    handle = head.register_forward_pre_hook(take)
    try:
        output = forward(*args, **{**kwargs, "labels": None})
    finally:
        handle.remove()
    if len(taken) != 1:
        raise RuntimeError(f"head_chunk_size: {type(target).__name__}'s forward called its output projection "
                           f"{len(taken)} times (expected once)")
    loss = _loss(target, head, taken[0], labels, size, kwargs)
    aux = output.get("aux_loss") if isinstance(output, dict) else None
    if aux is not None:
        loss = loss + getattr(target, _AUX) * aux.to(loss.device)
    if isinstance(output, dict):
        return type(output)(loss=loss, **{k: v for k, v in output.items() if k not in ("loss", "logits")})
    return (loss, None, *output[1:])


def install(state: CheckpointState, target: nn.Module) -> None:
    """Wrap ``target.forward`` so that training steps with labels run the chunked head whenever the record on
    ``target`` has a ``head_chunk_size`` (read at each call); recorded in ``state.undo``."""
    previous = target.__dict__.get("forward")
    target.forward = functools.wraps(target.forward)(functools.partial(_forward, target, target.forward))
    state.undo.append(lambda: target.__dict__.update(forward=previous) if previous else target.__dict__.pop("forward"))
