"""Watching the blocks of a model through one training step: RNG states and input versions at every run."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterator

import torch
from torch import nn

from hf_ckpt.runtime.blocks import Block
from hf_ckpt.runtime._torch import version_counter
from hf_ckpt.verification.report import InplaceInput


def _rng_state(devices: list[torch.device]) -> list[torch.Tensor]:
    """The CPU RNG state and the RNG state of every accelerator device in ``devices``."""
    states = [torch.get_rng_state()]
    for device in devices:
        backend = getattr(torch, device.type, None)
        if backend is not None and hasattr(backend, "get_rng_state"):
            states.append(backend.get_rng_state(device.index if device.index is not None else backend.current_device()))
    return states


def _same_rng_state(first: list[torch.Tensor], second: list[torch.Tensor]) -> bool:
    return len(first) == len(second) and all(torch.equal(a, b) for a, b in zip(first, second))


def _named_tensors(block: nn.Module, args: tuple, kwargs: dict) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors a block was called with, named as its ``forward`` names its parameters."""
    try:
        names = list(inspect.signature(block.forward).parameters)
    except (TypeError, ValueError):
        names = []
    positional = [
        (names[i] if i < len(names) and names[i] not in ("args", "kwargs") else f"args[{i}]", value)
        for i, value in enumerate(args)
    ]
    for name, value in positional + list(kwargs.items()):
        if isinstance(value, torch.Tensor):
            yield name, value
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                if isinstance(item, torch.Tensor):
                    yield f"{name}[{i}]", item


class StepProbe:
    """Hooks on the blocks of a model that watch one step.

    For every block it records, at the block's first call in the step, the RNG state and the version of every
    input tensor, and at the block's exit the RNG state again (did the block draw random numbers?). A forward
    pre-hook on every submodule finds the block's *sentinel*, the first submodule it calls, as
    :class:`~hf_ckpt.runtime.counting.BlockRunCounter` does: every later run of the sentinel is a recompute (block
    hooks do not see a recompute on transformers >= 5.23), where the probe records the RNG state and compares the
    inputs' versions with those of the forward.
    """

    def __init__(self, blocks: list[Block], devices: list[torch.device]) -> None:
        self._blocks = blocks
        self._devices = devices
        self._sentinels: dict[int, nn.Module] = {}
        self._handles: list[Any] = []
        self.entry_rng: dict[int, list[torch.Tensor]] = {}
        self.exit_rng: dict[int, list[torch.Tensor]] = {}
        self.run_rng: dict[int, list[list[torch.Tensor]]] = {}
        self.inputs: dict[int, list[tuple[str, torch.Tensor, int]]] = {}
        self.inplace: list[InplaceInput] = []

    def __enter__(self) -> "StepProbe":
        for block in self._blocks:
            self._handles.append(block.module.register_forward_pre_hook(self._on_entry(block.index), with_kwargs=True))
            self._handles.append(block.module.register_forward_hook(self._on_exit(block.index)))
            for submodule in block.module.modules():
                if submodule is not block.module:
                    self._handles.append(submodule.register_forward_pre_hook(self._on_submodule(block.index)))
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def draws_random_numbers(self, index: int) -> bool:
        entry, exit_ = self.entry_rng.get(index), self.exit_rng.get(index)
        return entry is not None and exit_ is not None and not _same_rng_state(entry, exit_)

    def rng_replayed(self, index: int) -> bool:
        runs = self.run_rng.get(index, [])
        return all(_same_rng_state(runs[0], later) for later in runs[1:])

    def _on_entry(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if index in self.entry_rng:
                return  # a stack-flag recompute calls the block again
            self.entry_rng[index] = _rng_state(self._devices)
            self.inputs[index] = [(name, t, version_counter(t)) for name, t in _named_tensors(module, args, kwargs)]

        return hook

    def _on_exit(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            self.exit_rng.setdefault(index, _rng_state(self._devices))

        return hook

    def _on_submodule(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple) -> None:
            if self._sentinels.setdefault(index, module) is not module:
                return
            runs = self.run_rng.setdefault(index, [])
            runs.append(_rng_state(self._devices))
            if len(runs) > 1:
                self._check_versions(index)

        return hook

    def _check_versions(self, index: int) -> None:
        for name, tensor, version in self.inputs.get(index, []):
            if version_counter(tensor) != version and not any(
                item.block == index and item.argument == name for item in self.inplace
            ):
                self.inplace.append(InplaceInput(index, name, version, version_counter(tensor)))
