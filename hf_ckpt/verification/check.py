"""``verify``: one step with the model's checkpointing and one without, compared."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Mapping

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hf_ckpt.planning.preserve import accelerator_devices, check_trainable, preserved
from hf_ckpt.runtime.state import ACTIVE_ATTRIBUTE, get_state, suspended
from hf_ckpt.runtime.target import target_model
from hf_ckpt.runtime.blocks import find_blocks
from hf_ckpt.runtime.apply import checkpointed_layers
from hf_ckpt.runtime.counting import BlockRunCounter
from hf_ckpt.runtime.functions import stack_checkpoints
from hf_ckpt.distributed._engines import wrapped_blocks
from hf_ckpt.meters.step import LossFn, loss_of
from hf_ckpt.verification.gradients import compare_gradients, parameter_groups
from hf_ckpt.verification.probe import StepProbe
from hf_ckpt.verification.report import VerifyReport


def _describe_setting(target: nn.Module, wrapped: list[int]) -> str:
    state = get_state(target)
    if state is not None:
        return f"hf_ckpt.{state.source.value}({state.config.describe()})"
    if any(getattr(module, "gradient_checkpointing", False) is True for module in target.modules()):
        return "checkpointing flags set outside hf_ckpt"
    if wrapped:
        return f"checkpoint wrappers on blocks {wrapped}"
    return "checkpointing not enabled"


@contextlib.contextmanager
def _checkpointing_off(target: nn.Module) -> Iterator[None]:
    """Switch checkpointing off everywhere, then put back exactly what was there (the same objects).

    Turns off every ``gradient_checkpointing`` flag, the switch of hf_ckpt's own checkpoint wrappers
    (``hf_ckpt.distributed.apply``) and the selecting function of a stack whose flag hf_ckpt keeps off (its loop
    hard-codes torch's checkpoint; hf_ckpt wraps its blocks). Nothing else changes: hf_ckpt's state, hooks and
    the blocks' checkpoint functions stay in place, so nothing has to be rebuilt afterwards, whoever enabled
    checkpointing.
    """
    switch = ACTIVE_ATTRIBUTE
    switches = [m for m in target.modules() if switch in m.__dict__]
    flags = [
        (module, "gradient_checkpointing" in module.__dict__, module.__dict__.get("gradient_checkpointing"))
        for module in target.modules()
        if hasattr(module, "gradient_checkpointing")
    ]
    wrapping = [(m, m.__dict__["_gradient_checkpointing_func"]) for m, _, _ in flags
                if not m.gradient_checkpointing and stack_checkpoints(m) and "_gradient_checkpointing_func" in m.__dict__]
    saved_switches = [(m, m.__dict__[switch]) for m in switches]
    for module, _, _ in flags:
        module.gradient_checkpointing = False
    for module, _ in wrapping:
        module._gradient_checkpointing_func = checkpoint
    for module in switches:
        module.__dict__[switch] = False
    try:
        yield
    finally:
        for module, existed, value in flags:
            if existed:
                module.gradient_checkpointing = value
            else:
                del module.gradient_checkpointing
        for module, function in wrapping:
            module._gradient_checkpointing_func = function
        for module, value in saved_switches:
            module.__dict__[switch] = value


def _loss_of(output: Any, loss_fn: LossFn | None) -> torch.Tensor:
    return loss_of(output, loss_fn, caller="verify: ", inputs="sample_inputs")


def _step(
    model: nn.Module,
    sample_inputs: Mapping[str, Any],
    loss_fn: LossFn | None,
    seed: int,
    after_forward: Callable[[], None] = lambda: None,
) -> tuple[float, dict[str, torch.Tensor]]:
    """One forward and backward from RNG seed ``seed``; returns the loss and a copy of every gradient."""
    for parameter in model.parameters():
        parameter.grad = None
    torch.manual_seed(seed)
    loss = _loss_of(model(**sample_inputs), loss_fn)
    after_forward()
    loss.backward()
    gradients = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), gradients


def _check_arguments(sample_inputs: Any, rtol: float | None, atol: float, seed: int) -> None:
    if not isinstance(sample_inputs, Mapping):
        raise TypeError(
            "sample_inputs must be a dict of keyword arguments for the model's forward, e.g. "
            f"{{'input_ids': ..., 'labels': ...}}; got {type(sample_inputs).__name__}"
        )
    if rtol is not None and (isinstance(rtol, bool) or not isinstance(rtol, (int, float)) or not rtol >= 0):
        raise ValueError(f"rtol must be None (a default by dtype) or a float >= 0; got {rtol!r}")
    if isinstance(atol, bool) or not isinstance(atol, (int, float)) or not atol >= 0:
        raise ValueError(f"atol must be a float >= 0; got {atol!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int; got {seed!r} of type {type(seed).__name__}")


def verify(
    model: nn.Module,
    sample_inputs: Mapping[str, Any],
    *,
    loss_fn: LossFn | None = None,
    rtol: float | None = None,
    atol: float = 1e-8,
    seed: int = 0,
) -> VerifyReport:
    """Check a model's activation checkpointing on one training step of ``sample_inputs``.

    Runs one forward and backward with the model's current setting and one with checkpointing off, both in
    training mode from RNG seed ``seed``, and reports gradient parity per parameter group, the blocks that were
    recomputed against those that should have been, whether recomputed blocks replayed the forward's random
    numbers, and whether an input of a recomputed block was modified in place before its recompute.

    The model is left as it was: its checkpointing flags and hf_ckpt state (the very same objects), training mode,
    accumulated gradients and the global RNG state.

    Args:
        model: A ``PreTrainedModel`` or PEFT ``PeftModel``, checkpointing enabled by any means (``hf_ckpt.enable``,
            ``gradient_checkpointing_enable``, ``TrainingArguments(gradient_checkpointing=True)``).
        sample_inputs: Keyword arguments for ``model(**sample_inputs)``, on the model's device; a small batch
            with ``labels`` so that the output has a ``loss``.
        loss_fn: Turns the model's output into a scalar loss, for models or inputs without ``labels``.
        rtol: Largest accepted gradient difference, relative to the largest reference gradient of the group. By
            default ``1e-3``, or ``2e-2`` for fp16/bf16 gradients.
        atol: Absolute slack added to the tolerance.
        seed: RNG seed both steps start from.

    Returns:
        A :class:`VerifyReport`; ``report.ok`` is the verdict and ``print(report)`` shows the details.

    Raises:
        TypeError: ``sample_inputs`` is not a dict; ``model`` is no ``PreTrainedModel`` or ``PeftModel``.
        ValueError: ``rtol`` or ``atol`` is negative; the model returned no loss and ``loss_fn`` is None.
        Exception: Whatever the step *without* checkpointing raises: a model that fails without checkpointing
            cannot be verified. An error of the checkpointed step is reported in ``report.error`` instead.
    """
    _check_arguments(sample_inputs, rtol, atol, seed)
    target = target_model(model)
    check_trainable(target, "verify: ")
    blocks = find_blocks(target)
    devices = accelerator_devices(model)
    wrapped = wrapped_blocks(target)
    report = VerifyReport(
        model=type(model).__name__,
        setting=_describe_setting(target, wrapped),
        block_names=[block.name for block in blocks],
        expected_recomputed=sorted(set(checkpointed_layers(model)) | set(wrapped)),
        recomputed=[],
    )
    with preserved(model), torch.enable_grad():
        model.train()
        with suspended(target), _checkpointing_off(target), StepProbe(blocks, devices) as reference_probe:
            report.always_checkpointed = wrapped_blocks(target)
            report.reference_loss, reference = _step(model, sample_inputs, loss_fn, seed)
        forward_runs: dict[int, int] = {}
        try:
            with BlockRunCounter(model) as runs, StepProbe(blocks, devices) as probe:
                report.loss, checkpointed = _step(
                    model, sample_inputs, loss_fn, seed, after_forward=lambda: forward_runs.update(runs.counts)
                )
        except RuntimeError as error:  # CheckpointError is a RuntimeError
            report.error = f"{type(error).__name__}: {error}"
            report.inplace_inputs = probe.inplace
            return report
    # a block was recomputed when it ran again during backward (robust to blocks called twice per forward)
    report.recomputed = [b.index for b in blocks if runs.counts[b.index] > forward_runs.get(b.index, 0)]
    report.gradients = compare_gradients(parameter_groups(model), checkpointed, reference, rtol, atol)
    report.random_blocks = [i for i in report.recomputed if reference_probe.draws_random_numbers(i)]
    report.rng_mismatch = [i for i in report.random_blocks if not probe.rng_replayed(i)]
    report.inplace_inputs = probe.inplace
    return report
