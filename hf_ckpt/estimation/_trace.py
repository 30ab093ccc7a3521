"""Trace one training step of the reduced model on fake tensors: bytes retained per block, peak, FLOPs.

The reduced model (at most two blocks per block type, see :mod:`._model`) gets parameters made under a
``FakeTensorMode``: tensors with shapes, dtypes and a device but no data, so a step at 8k tokens of a 70B
layer costs milliseconds and no memory. The step runs under :class:`hf_ckpt.measure.StorageTracker`, the same
tracker :func:`hf_ckpt.measure.measure_step` uses on real tensors, with each storage labelled by the block that
created it (as the planner does): what is alive when forward returns, per block and outside the blocks, is
what a real step retains. FLOPs come from :func:`hf_ckpt.measure.count_flops` on the same fake step, so they
are the figures ``hf_ckpt.measure`` would count on a real one.

Data-dependent Python control flow (``if tensor.item()``) cannot run on fake tensors; batches are built without
an attention mask (causal models use ``is_causal``), which is the packed-sequence case.

With ``autocast`` (mixed precision: parameters in one dtype, matmuls in a lower one) each forward runs under
``torch.autocast("cpu", dtype=autocast)`` and its backward outside, as the ``Trainer`` (accelerate) runs them, on
the fake CPU tensors the trace uses for every target device: matmul, linear and attention outputs take the lower
dtype, and what autocast leaves alone (the residual stream added to float32 embeddings, losses) keeps its own.
Each forward enters autocast anew, so its cast weights are made, and counted, in every step (autocast's cache of
them lives as long as the context).
"""

from __future__ import annotations

import contextlib
import inspect
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from hf_ckpt.runtime import _torch
from hf_ckpt.runtime.apply import apply_request, remove
from hf_ckpt.runtime.util.flop_formulas import missing_formulas
from hf_ckpt.runtime.target import target_model
from hf_ckpt.runtime._torch import TorchDispatchMode, tree_leaves, tree_map
from hf_ckpt.runtime.blocks import Block
from hf_ckpt.runtime.request import EnableRequest
from hf_ckpt.meters.memory import StorageTracker, block_labels
from hf_ckpt.meters.step import loss_of
from hf_ckpt.runtime.plans import CheckpointPlan
from hf_ckpt.strategies.selective.policy import SelectiveRecomputeError
from hf_ckpt.strategies import FULL as EVERY_BLOCK, kind_class
from hf_ckpt.estimation._attention import attention_for
from hf_ckpt.estimation._model import block_key

#: The per-block strategies traced; every other strategy (every_n:k, a plan) is composed from them.
TRACED = ("none", "full", "selective")


@dataclass(frozen=True)
class Trace:
    """What the reduced model's step cost.

    A block's retained bytes depend on its own strategy and on the next block's: its output is kept for backward
    when the next block checkpoints it (as the checkpoint's input), and otherwise only if the next block's first
    op saves it (an fp32 norm does in fp32, not in bf16, where it saves its own upcast copy). So memory is
    traced for each strategy on all blocks, then for each ordered pair of strategies alternating, and each block's
    bytes are kept with its neighbours' strategies (the last block of a stack also depends on the one before it).
    Where the first block of a stack is a type of its own (T5's, which computes the position bias every later
    block of the stack reads), a block also depends on that head's strategy: the alternations are traced again
    with each head on each strategy, and the head's strategy is part of the key.

    Attributes:
        base_bytes: ``base_bytes[s]``: bytes retained outside the blocks when the first block runs ``s``.
        block_bytes_seen: ``[(j, p, s, t, h)]``: bytes traced block ``j`` retains running ``s`` when block
            ``j - 1`` runs ``p``, block ``j + 1`` runs ``t`` (None at the ends) and the head of its stack runs ``h``
            (None where the stack has no head of its own type).
        transient: ``transient[s]``: the step's peak above the bytes retained at the end of forward with every
            block on ``s`` (gradients excluded: they are counted apart).
        step_flops: FLOPs of the reduced step without checkpointing.
        block_flops: Forward and backward FLOPs of each traced block without checkpointing.
        recompute_flops: ``recompute_flops[s][j]``: FLOPs traced block ``j`` adds to the step under ``s`` (its
            recompute, and any change of kernel checkpointing makes in it: may be below zero).
        unusable: Strategies that cannot run on this model, with the reason.
        used_parameters: Names of the traced model's parameters that received a gradient (the others, a vision
            tower trained on text, a pooler no loss reaches, get neither gradient nor optimizer state).
        chunked_base, chunked_transient: Per uniform strategy, ``base_bytes`` and ``transient`` with the output
            projection and loss chunked and checkpointed (``head_chunk_size``); empty when not traced.
        chunked_flops: The FLOPs the chunked head adds to the step (its projection recomputed in backward).
        head_chunk: The chunk (tokens) the chunked head was traced with, or None.
        chunked_refused: Why the chunked head cannot run on this model (``enable``'s error), or None.
        smaller_chunked: ``(chunked_base, chunked_transient, chunked_flops, chunked_refused, head_chunk)`` for a
            second, smaller chunk, or ``()`` when not traced.
        heads: ``heads[j]``: the position of the head of traced block ``j``'s stack (its first block, where that
            block is a type of its own), or None.
        mlp_chunk: The chunk (tokens) the chunked MLP (``mlp_chunk_size``) was traced with, or None.
        mlp_rows: Every block ``full`` and its MLP chunked, keyed by the head's chunk (None: the head whole):
            ``(base bytes, bytes per traced block, transient, FLOPs added to the step with every block full)``.
        mlp_refused: Why the chunked MLP cannot run on this model (``enable``'s error), or None.
        timelines: The backward as the gradients appear (:class:`StepTimeline`), keyed by the uniform strategy
            (``"full"``), with the chunked head ``"full+head:<chunk>"``, with the chunked MLP ``"full+mlp"`` or
            ``"full+head:<chunk>+mlp"``; missing where a block's backward could not be told apart.
    """

    base_bytes: dict[str, int]
    block_bytes_seen: dict[tuple[int, str | None, str, str | None, str | None], int]
    transient: dict[str, int]
    step_flops: int
    block_flops: tuple[int, ...]
    recompute_flops: dict[str, tuple[int, ...]]
    unusable: dict[str, str]
    used_parameters: frozenset[str] = frozenset()
    heads: tuple[int | None, ...] = ()
    chunked_base: dict[str, int] = field(default_factory=dict)
    chunked_transient: dict[str, int] = field(default_factory=dict)
    chunked_flops: int = 0
    chunked_refused: str | None = None
    head_chunk: int | None = None
    smaller_chunked: tuple = ()
    mlp_chunk: int | None = None
    mlp_rows: dict[int | None, tuple[int, tuple[int, ...], int, int]] = field(default_factory=dict)
    mlp_refused: str | None = None
    timelines: dict[str, "StepTimeline"] = field(default_factory=dict)

    @property
    def strategies(self) -> tuple[str, ...]:
        return tuple(self.recompute_flops)

    def block_bytes(self, block: int, previous: str | None, strategy: str, following: str | None,
                    head: str | None = None) -> int:
        """Bytes traced block ``block`` retains under ``strategy`` between blocks running ``previous`` and
        ``following``, the head of its stack running ``head``; where that combination was not traced, the
        largest traced with the same neighbours, else with the same next block, else the largest for the
        strategy (never an understatement)."""
        exact = self.block_bytes_seen.get((block, previous, strategy, following, head))
        if exact is not None:
            return exact
        seen = self.block_bytes_seen.items()
        same_neighbours = [v for (j, p, s, t, _h), v in seen if (j, p, s, t) == (block, previous, strategy, following)]
        if same_neighbours:
            return max(same_neighbours)
        same_next = [v for (j, _p, s, t, _h), v in seen if (j, s, t) == (block, strategy, following)]
        if same_next:
            return max(same_next)
        return self.largest(block, strategy)

    def largest(self, block: int, strategy: str) -> int:
        """The most traced block ``block`` retains under ``strategy``, whatever its neighbours run."""
        return max(v for (j, _p, s, _t, _h), v in self.block_bytes_seen.items() if j == block and s == strategy)

    def head_of(self, block: int) -> int | None:
        """The traced position of the head of traced block ``block``'s stack, or None."""
        return self.heads[block] if block < len(self.heads) else None


@dataclass(frozen=True)
class StepTimeline:
    """The traced backward with the gradients appearing as they do after ``zero_grad(set_to_none=True)``, split by
    the block whose backward runs (it starts when the gradient of the block's output is ready), so that it scales
    to the full depth. Every figure counts activations, transients and the gradients made so far, not the
    parameters or optimizer states.

    Attributes:
        forward_rise: The most the forward held above what it retains at its end (the loss's temporaries: the
            logits' float32 copies), or below zero where the forward's peak is its end.
        head_rise: The most the head and loss's backward holds above what forward retained.
        backward_base: What is held outside the blocks once the head's backward is done (its saved tensors gone).
        head_grads: The gradients made by then (the head's, the final norm's; tied embeddings').
        block_grads: Per traced block, the gradients of its parameters.
        block_rises: Per traced block, the most its backward holds above ``backward_base``, the activations of
            it and the blocks before it, ``head_grads`` and the gradients of the blocks after it (its own
            gradients appearing, its recompute, and, for the first block, the embeddings' gradients).
        after_backward: What is still held once backward is done, gradients left out: the outputs a loop keeps
            (``keep_outputs``), held through the optimizer step too.
    """

    forward_rise: int
    head_rise: int
    backward_base: int
    head_grads: int
    block_grads: tuple[int, ...]
    block_rises: tuple[int, ...]
    after_backward: int = 0


class _StepTracker(StorageTracker):
    """The storage tracker that also keeps, per backward phase, the most of the live bytes plus the gradients made
    so far (counted by hooks, since the trace's gradients are allocated before the step)."""

    def __init__(self, label: Any, devices: tuple[str, ...]) -> None:
        super().__init__(label=label)
        self.devices, self.grads, self.phase = devices, 0, None
        self.grads_by_block: dict[int | None, int] = {}  # None: parameters outside the blocks
        self.phase_peaks: dict[Any, int] = {}
        self.phase_starts: dict[Any, tuple[int, int]] = {}

    def _add(self, device: str, nbytes: int) -> None:
        super()._add(device, nbytes)
        if self.phase is not None:
            self._note()

    def _held(self) -> int:
        return sum(self._live[name] for name in self.devices)

    def _note(self) -> None:
        value = self._held() + self.grads
        if value > self.phase_peaks.get(self.phase, -1):
            self.phase_peaks[self.phase] = value

    def enter(self, phase: Any) -> None:
        """Start ``phase`` (once: a block's output gradient can be ready more than once only in odd graphs)."""
        with self._lock:
            if phase in self.phase_starts:
                return
            self.phase = phase
            self.phase_starts[phase] = (self._held(), self.grads)
            self._note()


@contextlib.contextmanager
def _backward_phases(model: nn.Module, blocks: list[Block], tracker: _StepTracker) -> Iterator[list[bool]]:
    """Marks each block's backward in ``tracker`` (a hook on the gradient of its output, registered in forward
    while the returned flag is up) and counts each gradient once, where it appears, by block (None: outside)."""
    armed = [True]
    owner = {id(p): block.index for block in blocks for p in block.module.parameters()}
    made = tracker.grads_by_block

    def on_output(index: int):
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if armed[0] and torch.is_grad_enabled():
                first = next((t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad), None)
                if first is not None:
                    first.register_hook(lambda grad: tracker.enter(index))
        return hook

    seen: set[int] = set()

    def on_grad(parameter: torch.Tensor) -> None:
        if id(parameter) not in seen:
            seen.add(id(parameter))
            nbytes = parameter.numel() * parameter.element_size()
            tracker.grads += nbytes
            made[owner.get(id(parameter))] = made.get(owner.get(id(parameter)), 0) + nbytes

    handles = [block.module.register_forward_hook(on_output(block.index)) for block in blocks]
    handles += [p.register_post_accumulate_grad_hook(on_grad) for p in model.parameters() if p.requires_grad]
    try:
        yield armed
    finally:
        for handle in handles:
            handle.remove()


def _timeline(tracker: _StepTracker, blocks: list[Block], retained: int, per_block: tuple[int, ...],
              forward_peak: int, after_backward: int) -> StepTimeline | None:
    """The :class:`StepTimeline` of a traced step; None where some block's backward was not seen."""
    phases = [block.index for block in blocks]
    if any(index not in tracker.phase_starts for index in phases) or not phases:
        return None
    entered = [p for p in tracker.phase_starts if p != "head"]  # in the order the backward reached them
    held, head_grads = tracker.phase_starts[entered[0]]
    backward_base = held - sum(per_block)
    grads = tuple(tracker.grads_by_block.get(index, 0) for index in phases)
    rises = []
    for j, index in enumerate(phases):
        start = backward_base + sum(per_block[: j + 1]) + head_grads + sum(grads[j + 1:])
        rises.append(tracker.phase_peaks[index] - start)
    head_rise = tracker.phase_peaks.get("head", retained) - retained
    return StepTimeline(forward_peak - retained, head_rise, backward_base, head_grads, grads, tuple(rises),
                        after_backward)


@contextlib.contextmanager
def _untraced_dispatch() -> Iterator[None]:
    """Let transformers take the branches of a real eager step on fake tensors.

    transformers' ``is_tracing(tensor)`` counts a fake tensor as tracing (export, compile), and then materialises a
    causal mask that a real step skips (it passes ``is_causal`` to SDPA instead): the fake step would keep a mask
    tensor, and on CUDA would lose the flash kernel, that the real one does not. For the trace's duration every
    ``is_tracing`` transformers imported answers as for a real tensor (the checks without a tensor still apply).
    """
    import sys

    try:
        from transformers.utils import import_utils
    except ImportError:  # pragma: no cover
        yield
        return
    original = getattr(import_utils, "is_tracing", None)
    if original is None:
        yield
        return

    def is_tracing(tensor: Any = None) -> bool:
        return original(None)

    patched = [
        module for name, module in list(sys.modules.items())
        # vars(), not getattr(): transformers' lazy modules import on attribute access (torchvision and more)
        if name.startswith("transformers") and module is not None and vars(module).get("is_tracing") is original
    ]
    for module in patched:
        module.is_tracing = is_tracing
    try:
        yield
    finally:
        for module in patched:
            module.is_tracing = original


_GROUPED_MM = _torch.aten_op("_grouped_mm")


class _AssumedChecks(TorchDispatchMode):
    """What fake tensors cannot answer by themselves, answered as a real CPU step would.

    * Boolean checks transformers reads from tensor values (``if (mask == 0).all():``) answer True: every such
      check in a training forward asks whether the batch is the plain case (no packed sequences, no padding),
      which is the batch traced. Any other value read raises as before.
    * ``_grouped_mm`` (mixture-of-experts layers) on a dtype other than bf16: the CPU kernel takes it, the shape
      function refuses it (it checks the CUDA kernel's dtype); the shapes are computed in bf16 and the output
      given the input's dtype.
    """

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is _torch.local_scalar_dense() and args and args[0].dtype is torch.bool:
            return True
        if _GROUPED_MM is not None and func in (_GROUPED_MM.default,) and args[0].dtype is not torch.bfloat16:
            dtype = args[0].dtype
            converted = [a.to(torch.bfloat16) if i < 2 else a for i, a in enumerate(args)]
            return func(*converted, **kwargs).to(dtype)
        return func(*args, **kwargs)


def fake_mode() -> Any:
    return _torch.fake_tensor_mode()


def to_fake(model: nn.Module, mode: Any, device: str = "cpu") -> nn.Module:
    """Replace the (meta) parameters and buffers of ``model`` by fake tensors on ``device``, ties kept."""
    made: dict[int, torch.Tensor] = {}
    with mode:
        for module in model.modules():
            parameters, buffers = _torch.own_parameters(module), _torch.own_buffers(module)
            for name, parameter in list(parameters.items()):
                if parameter is None:
                    continue
                if id(parameter) not in made:
                    data = torch.empty(parameter.shape, dtype=parameter.dtype, device=device)
                    made[id(parameter)] = nn.Parameter(data, requires_grad=parameter.requires_grad)
                parameters[name] = made[id(parameter)]
            for name, buffer in list(buffers.items()):
                if buffer is None:
                    continue
                if id(buffer) not in made:
                    made[id(buffer)] = torch.zeros(buffer.shape, dtype=buffer.dtype, device=device)
                buffers[name] = made[id(buffer)]
    return model


def _loss(output: Any) -> torch.Tensor:
    try:
        return loss_of(output, None)
    except ValueError:  # loss_of's advice (loss_fn) is not the estimate's: the batch is the estimate's own
        raise ValueError("model_or_config: the model returned no loss for token ids with labels: it has no training "
                         "head the estimate can use") from None


def _forward(model: nn.Module, inputs: Mapping[str, Any], autocast: torch.dtype | None) -> Any:
    """``model(**inputs)``, under autocast to ``autocast`` when given (entered anew: its cast cache is this step's)."""
    with torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext():
        return model(**inputs)


def _apply(model: nn.Module, strategies: tuple[str, ...], head_chunk: int | None = None,
           mlp_chunk: int | None = None) -> None:
    """Set one strategy per block (a :class:`~hf_ckpt.CheckpointPlan`), the chunked head if ``head_chunk`` and the
    chunked MLP if ``mlp_chunk``, or remove checkpointing for all-none without them."""
    remove(model)
    if any(kind_class(s).recomputes for s in strategies) or head_chunk or mlp_chunk:
        apply_request(model, EnableRequest.of(plan=CheckpointPlan(strategies), head_chunk_size=head_chunk,
                                              mlp_chunk_size=mlp_chunk))


def _chunked_head(model: nn.Module, blocks: list[Block], inputs: Mapping[str, Any], mode: Any, device: str,
                  strategies: list[str], unusable: dict[str, str], head_chunk: int | None, autocast: torch.dtype | None,
                  keep_outputs: bool, timelines: dict) -> tuple:
    """Base bytes and transient per usable uniform strategy with the chunked head (their timelines into
    ``timelines``), the FLOPs it adds, the reason it
    cannot run (None) and the chunk, as :class:`Trace` holds them; nothing without ``head_chunk``."""
    base: dict[str, int] = {}
    transient: dict[str, int] = {}
    if not head_chunk:
        return ()
    try:
        for strategy in [s for s in strategies if s not in unusable]:
            _apply(model, (strategy,) * len(blocks), head_chunk)  # a model that refuses it raises ValueError here
            base[strategy], _, transient[strategy], timeline = _memory_step(model, blocks, inputs, mode, device,
                                                                            autocast, keep_outputs)
            if timeline is not None:
                timelines[f"{strategy}+head:{head_chunk}"] = timeline
        remove(model)
        plain, _ = _flops_step(model, inputs, mode, autocast=autocast)
        _apply(model, ("none",) * len(blocks), head_chunk)
        chunked, _ = _flops_step(model, inputs, mode, autocast=autocast)
    except ValueError as error:
        return {}, {}, 0, str(error), head_chunk
    except (RuntimeError, TypeError) as error:  # never the estimate's failure: the row is left out, with the reason
        return {}, {}, 0, f"the chunked head could not be traced on this model: {error}", head_chunk
    finally:
        remove(model)
    return base, transient, chunked - plain, None, head_chunk


def _chunked_mlp(model: nn.Module, blocks: list[Block], inputs: Mapping[str, Any], mode: Any, device: str,
                 mlp_chunk: int | None, head_chunks: tuple[int | None, ...], autocast: torch.dtype | None,
                 keep_outputs: bool, timelines: dict) -> tuple[dict, str | None]:
    """:attr:`Trace.mlp_rows` and :attr:`Trace.mlp_refused`: every block ``full`` with the MLP in chunks of
    ``mlp_chunk``, with the head whole and in each of ``head_chunks``; nothing without ``mlp_chunk``."""
    rows: dict = {}
    if not mlp_chunk:
        return rows, None
    full = ("full",) * len(blocks)
    try:
        _apply(model, full)
        plain, _ = _flops_step(model, inputs, mode, autocast=autocast)
        for head_chunk in (None, *head_chunks):
            _apply(model, full, head_chunk, mlp_chunk)  # a model that refuses it raises ValueError here
            base, per_block, transient, timeline = _memory_step(model, blocks, inputs, mode, device, autocast,
                                                                keep_outputs)
            if timeline is not None:
                timelines[f"full+head:{head_chunk}+mlp" if head_chunk else "full+mlp"] = timeline
            _apply(model, full, None, mlp_chunk)
            flops, _ = _flops_step(model, inputs, mode, autocast=autocast)
            rows[head_chunk] = (base, per_block, transient, flops - plain)
    except ValueError as error:
        return {}, str(error)
    except (RuntimeError, TypeError) as error:  # never the estimate's failure: the row is left out, with the reason
        return {}, f"the chunked MLP could not be traced on this model: {error}"
    finally:
        remove(model)
    return rows, None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _memory_step(model: nn.Module, blocks: list[Block], inputs: Mapping[str, Any], mode: Any, device: str,
                 autocast: torch.dtype | None = None, keep_outputs: bool = False):
    """(base bytes, bytes per block, transient peak, :class:`StepTimeline` or None) of one fake step, labelled by
    block. Only the loss is held into backward (the ``Trainer``'s step), or, with ``keep_outputs``, the whole output
    object (a loop that keeps ``outputs = model(**batch)`` alive through ``outputs.loss.backward()``: logits and all
    else it holds). The transient is measured with every gradient allocated before the step (gradient
    accumulation's later micro-batches), the timeline as the gradients appear."""
    # fake tensors live on "meta"; checkpointing's RNG states are real host tensors: activations where the
    # target is the CPU, host memory beside the device's otherwise
    devices = ("meta", "cpu") if device == "cpu" else ("meta",)
    with block_labels(blocks) as label, mode, _AssumedChecks(), attention_for(device), \
            _StepTracker(label, devices) as tracker, _backward_phases(model, blocks, tracker) as armed:
        outputs = _forward(model, inputs, autocast)
        loss = _loss(outputs)
        outputs = outputs if keep_outputs else None
        by_block = Counter()
        for name in devices:
            by_block.update(tracker.live_bytes_by_label(name))
        retained = sum(by_block.values())
        forward_peak = sum(tracker.peak_bytes().get(name, 0) for name in devices)
        tracker.reset_peak()
        armed[0] = False
        tracker.enter("head")
        loss.backward()
        peak = sum(tracker.peak_bytes().get(name, 0) for name in devices)
        del loss
        after_backward = tracker._held() if keep_outputs else 0  # what the loop's kept outputs still hold
        del outputs
    per_block = tuple(by_block.get(block.index, 0) for block in blocks)
    timeline = _timeline(tracker, blocks, retained, per_block, forward_peak, after_backward)
    return by_block.get(None, 0), per_block, max(0, peak - retained), timeline


def _flops_step(
    model: nn.Module, inputs: Mapping[str, Any], mode: Any, used: set[str] | None = None,
    autocast: torch.dtype | None = None,
) -> tuple[int, dict[str, int]]:
    """Whole-step FLOPs and FLOPs per module name, of one fake step; ``used`` collects the names of the
    parameters that received a gradient."""
    from torch.utils.flop_counter import FlopCounterMode

    handles = []
    if used is not None:
        for name, parameter in model.named_parameters():
            if parameter.requires_grad:
                handles.append(parameter.register_post_accumulate_grad_hook(lambda p, n=name: used.add(n)))
    counter = FlopCounterMode(display=False, custom_mapping=missing_formulas())
    try:
        with mode, _AssumedChecks(), counter:
            _loss(_forward(model, inputs, autocast)).backward()
    finally:
        for handle in handles:
            handle.remove()
    per_module = {name: sum(counts.values()) for name, counts in counter.get_flop_counts().items()}
    return int(counter.get_total_flops()), per_module


def _preallocate_grads(model: nn.Module, mode: Any) -> None:
    """Gradients exist before the step (counted apart, as persistent state), so the tracker does not count them."""
    with mode:
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.grad = torch.zeros_like(parameter)


def _captured_inputs(model: nn.Module, blocks: list[Block], inputs: Mapping[str, Any], mode: Any,
                     autocast: torch.dtype | None = None) -> list[tuple]:
    """The (args, kwargs) each block is called with in a forward of ``model`` (fake tensors, detached with
    their ``requires_grad``), to run each block on its own."""
    captured: dict[int, tuple] = {}

    def keep(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.detach().requires_grad_(value.requires_grad)
        if type(value).__name__.endswith("Cache"):  # a KV cache would grow with each run and tie the graphs
            return None
        return value

    def hook(index: int):
        def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if index not in captured:
                captured[index] = tree_map(keep, (args, kwargs))
        return pre

    handles = [block.module.register_forward_pre_hook(hook(block.index), with_kwargs=True) for block in blocks]
    if "use_cache" in inspect.signature(target_model(model).forward).parameters:
        inputs = {**inputs, "use_cache": False}  # a cache in the captured kwargs would grow with each block run
    try:
        with mode, _AssumedChecks():  # with autograd on: the inputs' requires_grad is what a real step has
            _forward(model, inputs, autocast)
    finally:
        for handle in handles:
            handle.remove()
    return [captured.get(block.index) for block in blocks]  # None: the block did not run (a vision tower on text)


def _block_step_flops(block: Block, call: tuple | None, mode: Any) -> int:
    """Forward and backward FLOPs of one block run on its own, with a gradient for every output that needs one
    (as the next block, or the head, gives it in a real step)."""
    from torch.utils.flop_counter import FlopCounterMode

    if call is None:
        return 0
    args, kwargs = call
    counter = FlopCounterMode(display=False, custom_mapping=missing_formulas())
    with mode, _AssumedChecks(), counter:
        out = block.module(*args, **kwargs)
        needs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        if needs:
            torch.autograd.backward(needs, [torch.ones_like(t) for t in needs])
    return int(counter.get_total_flops())


def _twins(blocks: list[Block]) -> list[list[int]]:
    """Positions of the traced blocks grouped by block type (same class, parameter shapes, attention type)."""
    groups: dict[tuple, list[int]] = {}
    for position, block in enumerate(blocks):
        groups.setdefault(block_key(block), []).append(position)
    return list(groups.values())


def stack_heads(blocks: list[Block]) -> tuple[int | None, ...]:
    """For each traced block, the position of the first block of its stack when that block is a type of its own
    (T5's first block, which owns the relative position bias), else None."""
    alone = {group[0] for group in _twins(blocks) if len(group) == 1}
    heads: list[int | None] = []
    first_of: dict[str, int] = {}
    for position, block in enumerate(blocks):
        stack = block.name.rsplit(".", 1)[0]
        first = first_of.setdefault(stack, position)
        heads.append(first if first in alone else None)
    return tuple(heads)


def _patterns(strategies: tuple[str, ...], count: int, mixed: bool,
              heads: tuple[int | None, ...] = ()) -> list[tuple[str, ...]]:
    """Each strategy on every block, then (``mixed``) each ordered pair alternating: every neighbour pair occurs;
    with stack heads, each alternation again with every head on each strategy."""
    patterns = [(s,) * count for s in strategies]
    alternations = []
    for first in strategies:
        for second in strategies:
            if mixed and first != second and count > 1:
                alternations.append(tuple(first if j % 2 == 0 else second for j in range(count)))
    patterns += alternations
    positions = sorted({h for h in heads if h is not None})
    for pattern in alternations if positions else ():
        for strategy in strategies:
            varied = tuple(strategy if j in positions else s for j, s in enumerate(pattern))
            if varied not in patterns:
                patterns.append(varied)
    return patterns



def _recompute_flops(model: nn.Module, blocks: list[Block], inputs: Mapping[str, Any], mode: Any, strategy: str,
                     step_flops: int, autocast: torch.dtype | None) -> tuple[int, ...]:
    """Per block, the FLOPs ``strategy`` adds to the step by recomputing it: whole-step totals with the strategy on
    each group of twin blocks, shared evenly within the group (blocks of one type cost the same)."""
    count = len(blocks)
    if not kind_class(strategy).recomputes:
        return (0,) * count
    per_block = [0] * count
    for group in _twins(blocks):
        plan = tuple(strategy if j in group else "none" for j in range(count))
        _apply(model, plan)
        total, _ = _flops_step(model, inputs, mode, autocast=autocast)
        # not clamped at 0: a checkpointed block may run another kernel (T5 attention, below)
        share, remainder = divmod(total - step_flops, len(group))
        for position, j in enumerate(group):
            per_block[j] = share + (1 if position < remainder else 0)
    return tuple(per_block)

def trace(
    model: nn.Module, blocks: list[Block], inputs: Mapping[str, Any], mode: Any, device: str,
    strategies: tuple[str, ...] = TRACED,
    mixed: bool = True,
    autocast: torch.dtype | None = None,
    keep_outputs: bool = False,
    head_chunk: int | None = None,
    smaller_chunk: int | None = None,
    mlp_chunk: int | None = None,
) -> Trace:
    """Trace the fake ``model`` (its blocks ``blocks``) on ``inputs`` under each of ``strategies`` (and, with
    ``mixed``, their alternations, for plans that mix strategies), under autocast to ``autocast`` if given; with
    ``keep_outputs`` the model's outputs are held into backward (counted outside the blocks); with ``head_chunk``
    each uniform strategy once more with the output projection and loss chunked (``head_chunk_size``), and with
    ``smaller_chunk`` once more in chunks of that many tokens; with ``mlp_chunk`` every block full and its MLP in
    chunks of that many tokens, the head whole and chunked (:func:`_chunked_mlp`)."""
    count = len(blocks)
    base: dict[str, int] = {}
    seen: dict[tuple[int, str | None, str, str | None, str | None], int] = {}
    transient: dict[str, int] = {}
    timelines: dict[str, StepTimeline] = {}
    recompute: dict[str, tuple[int, ...]] = {}
    unusable: dict[str, str] = {}
    usable = list(dict.fromkeys(("none", *strategies)))
    heads = stack_heads(blocks)
    _preallocate_grads(model, mode)
    with _quiet(), _untraced_dispatch():
        plain = len(_patterns(tuple(usable), count, mixed))
        for number, pattern in enumerate(_patterns(tuple(usable), count, mixed, heads)):
            if any(s in unusable for s in pattern):
                continue
            _apply(model, pattern)
            try:
                outside, per_block, above, timeline = _memory_step(model, blocks, inputs, mode, device, autocast,
                                                                   keep_outputs)
            except SelectiveRecomputeError as error:
                unusable[next(s for s in pattern if kind_class(s).recomputes)] = str(error)
                continue
            except RuntimeError as error:  # selective recompute that cannot replay on fake tensors (4.57's Llama)
                if not (by_context := [s for s in pattern if kind_class(s).uses_context_fn]):
                    raise
                unusable[by_context[0]] = f"{by_context[0]} recompute could not be traced on this model: {error}"
                continue
            if len(set(pattern)) == 1:
                base[pattern[0]], transient[pattern[0]] = outside, above
                if timeline is not None:
                    timelines[pattern[0]] = timeline
            for j in range(count):
                previous = pattern[j - 1] if j > 0 else None
                following = pattern[j + 1] if j + 1 < count else None
                head = pattern[heads[j]] if heads[j] is not None else None
                key = (j, previous, pattern[j], following, head)
                if number < plain or key not in seen:  # a head variant adds contexts, never replaces one
                    seen[key] = per_block[j]
        chunked = _chunked_head(model, blocks, inputs, mode, device, usable, unusable, head_chunk, autocast, keep_outputs,
                                timelines)
        smaller = () if not chunked or chunked[3] is not None else _chunked_head(
            model, blocks, inputs, mode, device, usable, unusable, smaller_chunk, autocast, keep_outputs, timelines)
        heads_chunked = (head_chunk,) if chunked and chunked[3] is None and EVERY_BLOCK in chunked[0] else ()
        every_block = EVERY_BLOCK in usable and EVERY_BLOCK not in unusable  # the chunked MLP's rows build on it
        mlp_rows, mlp_refused = _chunked_mlp(model, blocks, inputs, mode, device, mlp_chunk, heads_chunked, autocast,
                                             keep_outputs, timelines) if every_block else ({}, None)
        remove(model)
        used: set[str] = set()
        step_flops, _per_module = _flops_step(model, inputs, mode, used, autocast)
        calls = _captured_inputs(model, blocks, inputs, mode, autocast)
        block_flops = tuple(_block_step_flops(block, call, mode) for block, call in zip(blocks, calls))
        for strategy in usable:
            if strategy not in unusable:
                recompute[strategy] = _recompute_flops(model, blocks, inputs, mode, strategy, step_flops, autocast)
        remove(model)
    for parameter in model.parameters():
        parameter.grad = None
    return Trace(base, seen, transient, step_flops, block_flops, recompute, unusable, frozenset(used), heads, *chunked,
                 smaller_chunked=smaller, mlp_chunk=mlp_chunk, mlp_rows=mlp_rows, mlp_refused=mlp_refused,
                 timelines=timelines)
