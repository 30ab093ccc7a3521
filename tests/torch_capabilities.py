"""What the running torch has: tests of a feature that needs more are skipped, the missing capability the reason.

One place for every such check (detected by capability, never by version string), so that no test copies one:

    from torch_capabilities import requires

    @requires("optim.Muon")
    def test_muon_states(): ...

    pytestmark = requires("checkpoint.respect_saved_tensors_hooks")   # a whole module

The reason reads ``this torch lacks <capability> (<where it first appears>)``; ``ci/compat_report.py`` lists the
capabilities each end of the torch range lacks from these reasons (``docs/compatibility.md``, section torch).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Callable

import pytest
import torch
import torch.utils.checkpoint

from hf_ckpt.runtime import _torch


def _importable(module: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            importlib.import_module(module)
        except ImportError:
            return False
        return True

    return check


def _fsdp():
    import torch.distributed.fsdp

    return torch.distributed.fsdp


def _has_checkpoint_argument(name: str) -> Callable[[], bool]:
    return lambda: name in inspect.signature(torch.utils.checkpoint.checkpoint).parameters


def _checkpoint_exits_contexts_on_error() -> bool:
    """Whether a non-reentrant checkpoint leaves its ``context_fn`` contexts when the checkpointed function raises,
    while the error is still held (torch 2.5's checkpoint keeps them entered until its generator is collected)."""
    import contextlib

    state = {"open": False}

    @contextlib.contextmanager
    def watched():
        state["open"] = True
        try:
            yield
        finally:
            state["open"] = False

    def fail(x):
        raise ValueError("probe")

    x = torch.ones(1, requires_grad=True)
    try:
        torch.utils.checkpoint.checkpoint(fail, x, use_reentrant=False,
                                          context_fn=lambda: (watched(), contextlib.nullcontext()))
    except ValueError as error:
        held = error  # noqa: F841 - the traceback (and the checkpoint's frame) stays alive here
        return not state["open"]
    return True


#: capability -> (check, what it is, with the first torch release that has it)
CAPABILITIES: dict[str, tuple[Callable[[], bool], str]] = {
    "checkpoint.selective": (
        lambda: all(hasattr(torch.utils.checkpoint, name)
                    for name in ("create_selective_checkpoint_contexts", "CheckpointPolicy")),
        "torch.utils.checkpoint.create_selective_checkpoint_contexts and CheckpointPolicy (torch >= 2.5)",
    ),
    "checkpoint.exits_contexts_on_error": (
        _checkpoint_exits_contexts_on_error,
        "a checkpoint that leaves its context_fn contexts when the checkpointed function raises (torch 2.5.1 keeps "
        "them entered while the error is held; 2.13.0 leaves them)",
    ),
    "optim.Adafactor": (lambda: hasattr(torch.optim, "Adafactor"), "torch.optim.Adafactor (torch >= 2.5)"),
    "optim.Muon": (lambda: hasattr(torch.optim, "Muon"), "torch.optim.Muon (torch >= 2.9)"),
    "cpu.Stream.wait_event": (
        lambda: hasattr(torch.cpu, "Stream") and hasattr(torch.cpu.Stream, "wait_event"),
        "torch.cpu.Stream.wait_event, the CPU stand-in for an accelerator's copy streams (2.5.1 lacks it, 2.13.0 has it)",
    ),
    "distributed.fsdp.fully_shard": (
        lambda: torch.distributed.is_available() and hasattr(_fsdp(), "fully_shard"),
        "torch.distributed.fsdp.fully_shard, FSDP2 as a public API (2.5.1 lacks it, 2.13.0 has it)",
    ),
    "distributed.tensor.debug": (
        _importable("torch.distributed.tensor.debug"),
        "torch.distributed.tensor.debug (CommDebugMode, torch >= 2.5 as a public module)",
    ),
    "autograd.saved_tensors_hooks_stack": (
        lambda: _torch.can_see_saved_tensors_hooks(),
        "a way to see the active saved-tensor hooks (torch._C._autograd._top_saved_tensors_default_hooks: "
        "2.5.1 lacks it, 2.13.0 has it)",
    ),
    "checkpoint.respect_saved_tensors_hooks": (
        _has_checkpoint_argument("respect_saved_tensors_hooks"),
        "torch.utils.checkpoint.checkpoint(respect_saved_tensors_hooks=...) (torch >= 2.14)",
    ),
}


def has(capability: str) -> bool:
    """Whether the running torch has ``capability`` (a key of :data:`CAPABILITIES`)."""
    return CAPABILITIES[capability][0]()


def reason(capability: str) -> str:
    return f"this torch lacks {CAPABILITIES[capability][1]}"


def requires(*capabilities: str) -> pytest.MarkDecorator:
    """A skip marker for a test (or, as ``pytestmark``, a module) that needs every one of ``capabilities``."""
    missing = [name for name in capabilities if not has(name)]
    return pytest.mark.skipif(bool(missing), reason="; ".join(reason(name) for name in missing) or "-")


def skip_unless(capability: str) -> None:
    """Inside a test: skip the rest of it, ``capability`` missing as the reason, when the running torch lacks it."""
    if not has(capability):
        pytest.skip(reason(capability))
