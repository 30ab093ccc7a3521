"""The chunked, checkpointed head (``head_chunk_size``). In a training forward with grad and ``labels``, a causal
LM's own forward runs with ``labels=None`` while a pre-hook hands its output projection an empty slice of the hidden
states (taken for the loss), so no full logits are made; the loss is the model's own loss function over chunks of
tokens, each chunk checkpointed (its logits freed once its share is taken, recomputed in backward), labels shifted
as it shifts them, shares divided by ``num_items_in_batch`` (or the labelled tokens: its mean), plus a MoE router's
auxiliary loss. The output comes back with ``loss`` and no logits (reading them raises an error that names
``head_chunk_size``); other calls run as without it. Everything runs in module hooks (:class:`ChunkedHead`): the
model's ``forward``, and whatever another library wrapped it in, is never assigned or deleted.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hf_ckpt.runtime.state import CheckpointState, peek_state, warn_stale
from hf_ckpt.runtime.util.warn import warn_once

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
    replaced = replaced_forward(target)
    if replaced is not None:
        return replaced
    if not isinstance(getattr(type(target), "loss_function", None), property):
        return "it computes its loss its own way (this transformers release has no PreTrainedModel.loss_function)"
    if "shift_labels" not in inspect.signature(target.loss_function).parameters:
        return f"its loss function {getattr(target.loss_function, '__name__', '?')} takes no shift_labels"
    return _forward_refusal(target, head_name)


def _loss(target: nn.Module, head: Any, hidden: torch.Tensor, labels: torch.Tensor, size: int,
          kwargs: dict[str, Any]) -> torch.Tensor:
    """The model's loss over ``hidden`` (the head's input, projected by ``head``), ``size`` tokens at a time, each
    chunk checkpointed."""
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
    try:
        names = list(inspect.signature(forward).parameters)
    except (TypeError, ValueError):
        return False
    return "labels" in names and len(args) > names.index("labels")


#: Forwards that other libraries put on a model in place of its own, which compute the loss from the hidden states
#: themselves and never call the output projection as the model's forward does: (file's folder, function) -> who.
_REPLACING_FORWARDS = {
    ("trl", "_fused_forward"): ("TRL's trainers (SFTTrainer, DPOTrainer, GRPOTrainer) replace its forward with their "
                                "fused LM head, which computes the per-token log-probabilities in chunks without the "
                                "full logits, as head_chunk_size would: TRL's fused head already saves that memory"),
}


def replaced_forward(target: nn.Module) -> str | None:
    """Why ``target``'s forward, replaced by another library, does not run the model's own head and loss (a
    :data:`_REPLACING_FORWARDS` entry), or None. Follows the instance's ``forward`` through the wrappers around it
    (accelerate's mixed precision wraps TRL's), reading each function's code object, which ``functools.wraps``
    leaves as it is."""
    function = target.__dict__.get("forward")
    for _ in range(16):  # a chain of wrappers, each naming what it wraps
        function = getattr(function, "__func__", function)
        code = getattr(function, "__code__", None)
        if code is not None:
            folders = code.co_filename.replace("\\", "/").split("/")
            why = next((why for (folder, name), why in _REPLACING_FORWARDS.items()
                        if name == code.co_name and folder in folders), None)
            if why is not None:
                return why
        function = getattr(function, "__wrapped__", None) or getattr(function, "func", None)
        if function is None:
            return None
    return None


class _Call:
    """One training forward the chunked head takes over: its labels and loss keywords, then its loss."""

    __slots__ = ("labels", "kwargs", "size", "loss", "taken")

    def __init__(self, labels: torch.Tensor, kwargs: dict[str, Any], size: int) -> None:
        self.labels, self.kwargs, self.size = labels, kwargs, size
        self.loss: torch.Tensor | None = None
        self.taken = 0


class ChunkedHead:
    """The chunked head's hooks on one model: composed with whatever else runs the model, never in place of it.

    * a forward pre-hook on the model takes a training forward's ``labels`` (the forward runs with ``labels=None``,
      so the model computes no loss of its own);
    * a forward pre-hook on the output projection, inside that forward (under its autocast, as the projection would
      run), computes the loss in checkpointed chunks from the projection's input, and hands the projection an empty
      slice of it, so no full logits are made;
    * a forward hook on the model puts the loss in the output, with no ``logits``.

    Another library's wrapper of ``forward`` (accelerate's mixed precision, a user's) runs between the hooks and is
    never touched. The record on the model is read at each call (:func:`~hf_ckpt.runtime.state.peek_state`), never
    dropped from inside a forward.
    """

    def __init__(self, target: nn.Module) -> None:
        self.target = target
        self.calls: list[_Call | None] = []  # one entry per forward of the model in progress (None: left alone)
        self.computing = 0  # > 0 while a chunk runs the projection (forward or recompute): those calls pass

    def _size(self) -> int | None:
        state = peek_state(self.target)
        if state is None:
            return None
        if not state.is_current():  # changed behind hf_ckpt's back: dropped (with its warning) at the next look
            warn_stale(self.target, state)
            return None
        return state.config.head_chunk_size

    def before(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple | None:
        call = self._start(module, args, kwargs)
        self.calls.append(call)
        return None if call is None else (args, {**kwargs, "labels": None})

    def _start(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> _Call | None:
        if not (module.training and torch.is_grad_enabled()) or any(self.calls):
            return None
        size = self._size()
        if size is None:
            return None
        replaced = replaced_forward(module)
        if replaced is not None:
            raise ValueError(f"head_chunk_size cannot apply to {type(module).__name__}: {replaced}. Drop "
                             "head_chunk_size.")
        labels = kwargs.get("labels")
        if labels is not None:
            return _Call(labels, kwargs, size)
        name = type(module).__name__
        if args and _labels_by_position(module.forward, args):
            warn_once(f"head_chunk_size={size} does not take effect: {name} was given its labels by position, and "
                      "the chunked head reads them by keyword (labels=...); this step computes the full logits",
                      key="head-chunk-positional-labels", owner=module)
        else:
            warn_once(f"head_chunk_size={size} does not take effect in a training forward without labels: {name} "
                      "computes the full logits, for a loss computed outside the model (the Trainer's "
                      "label_smoothing_factor or compute_loss_func take the labels out). Give the model its labels, "
                      "or drop head_chunk_size", key="head-chunk-no-labels", owner=module)
        return None

    def take(self, head: nn.Module, inputs: tuple) -> tuple | None:
        """The output projection's pre-hook: the loss in chunks from its input, and an empty slice handed on."""
        if self.computing:
            return None
        call = self.calls[-1] if self.calls else None
        if call is None:
            if not self.calls and head.training and torch.is_grad_enabled() and self._size() is not None:
                warn_once(f"head_chunk_size does not take effect: {type(self.target).__name__}'s output projection "
                          "ran outside a call of the model (its forward called directly, model.forward(...), which "
                          "skips the model's hooks); this step computes the full logits. Call the model itself",
                          key="head-chunk-direct-forward", owner=self.target)
            return None
        call.taken += 1
        if call.taken > 1:
            raise RuntimeError(f"head_chunk_size: {type(self.target).__name__}'s forward called its output "
                               f"projection {call.taken} times (expected once)")
        hidden = inputs[0]
        call.loss = _loss(self.target, functools.partial(self._project, head), hidden, call.labels, call.size,
                          call.kwargs)
        return (hidden[..., :0, :], *inputs[1:])

    def _project(self, head: nn.Module, states: torch.Tensor) -> torch.Tensor:
        self.computing += 1
        try:
            return head(states)
        finally:
            self.computing -= 1

    def after(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> Any:
        call = self.calls.pop() if self.calls else None
        if call is None or output is None:  # left alone, or the forward raised (this hook is always called)
            return None
        if call.loss is None:
            raise RuntimeError(f"head_chunk_size: {type(module).__name__}'s forward did not call its output "
                               "projection, so the chunked head computed no loss. Drop head_chunk_size")
        loss = call.loss
        aux = output.get("aux_loss") if isinstance(output, dict) else None
        if aux is not None:
            loss = loss + getattr(module, _AUX) * aux.to(loss.device)
        if isinstance(output, dict):
            fields = {k: v for k, v in output.items() if k not in ("loss", "logits")}
            return _without_logits(type(output), _no_logits(type(module).__name__, call.size), loss=loss, **fields)
        return (loss, None, *output[1:])


def _no_logits(name: str, size: int) -> str:
    return (f"head_chunk_size={size}: {name}'s training forward with labels returns no logits (the chunked head "
            "computes the loss over chunks of tokens without making the full logits). Code that reads the logits of "
            "a training step (a custom compute_loss, metrics on the logits) needs them: drop head_chunk_size for it")


def _refused_logits(self: Any) -> Any:
    raise AttributeError(self.__dict__["_hf_ckpt_no_logits"])


def _ignored(self: Any, value: Any) -> None:
    pass


def _refused_key(self: Any, key: Any) -> Any:
    if key == "logits":
        raise KeyError(self.__dict__["_hf_ckpt_no_logits"])
    return super(type(self), self).__getitem__(key)


@functools.lru_cache(maxsize=None)
def _output_class(cls: type) -> type:
    """``cls`` (a ``ModelOutput``) whose ``logits``, once built, raise an error that names ``head_chunk_size``."""
    return type(f"{cls.__name__}WithoutLogits", (cls,), {
        "__module__": __name__, "__doc__": cls.__doc__, "logits": property(_built_logits, _ignored),
        "__getitem__": _refused_key, "__repr__": _shown})


def _shown(self: Any) -> str:
    fields = ", ".join(f"{name}={value!r}" for name, value in self.items())
    return f"{type(self).__name__}({fields}, logits=<not made: head_chunk_size>)"


#: Packages whose code reads every field of an output generically (FSDP collects the tensors of a dataclass output,
#: accelerate and DeepSpeed move them): for them the logits are None, as for any field not given.
_WALKING_FIELDS = frozenset({"torch", "accelerate", "deepspeed"})
#: Standard-library helpers such code reads the fields through (``dataclasses.replace``, ``copy``).
_PASSED_THROUGH = frozenset({"dataclasses", "copy", "functools", "operator", "reprlib", "pprint"})


def _reader(frame: Any) -> str:
    """The top-level package of the code that read a field, past the standard library's helpers."""
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] in _PASSED_THROUGH:
        frame = frame.f_back
    return frame.f_globals.get("__name__", "").partition(".")[0] if frame is not None else ""


def _built_logits(self: Any) -> Any:
    if "_hf_ckpt_no_logits" in self.__dict__ and _reader(sys._getframe(1)) not in _WALKING_FIELDS:
        _refused_logits(self)
    return None  # also while the output is built: its class's checks read every field


def _without_logits(cls: type, message: str, **fields: Any) -> Any:
    """An output of ``cls`` with ``fields`` and no logits: reading them raises ``AttributeError(message)``."""
    try:
        output = _output_class(cls)(**fields)
    except (TypeError, ValueError):  # an output class that cannot be subclassed this way: plain, logits None
        return cls(**fields)
    output.__dict__["_hf_ckpt_no_logits"] = message
    return output


def install(state: CheckpointState, target: nn.Module) -> None:
    """The chunked head's hooks on ``target`` (:class:`ChunkedHead`), recorded in ``state.hooks``: training steps
    with labels run the chunked head whenever the record on ``target`` has a ``head_chunk_size`` (read at each
    call). Nothing of the model is assigned or deleted."""
    chunked = ChunkedHead(target)
    # innermost of the model's hooks: the last pre-hook and the first forward hook, so that every other hook (the
    # user's, another library's) sees the call as made and the output with its loss
    state.hooks.add(target, "register_forward_pre_hook", chunked.before, with_kwargs=True)
    state.hooks.add(target.get_output_embeddings(), "register_forward_pre_hook", chunked.take)
    state.hooks.add(target, "register_forward_hook", chunked.after, with_kwargs=True, always_call=True, prepend=True)
