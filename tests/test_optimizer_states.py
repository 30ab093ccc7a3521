"""What an optimizer's first step allocates (``budget="auto"`` leaves room for it), against real first steps."""

from __future__ import annotations

import pytest
import torch

import hf_ckpt
from hf_ckpt._optimizer_states import pending_state_bytes, registered_counts, unwrap

CASES = [
    (torch.optim.Adam, {}), (torch.optim.Adam, {"amsgrad": True}), (torch.optim.AdamW, {}),
    (torch.optim.AdamW, {"amsgrad": True}), (torch.optim.NAdam, {}), (torch.optim.RAdam, {}),
    (torch.optim.Adamax, {}), (torch.optim.Adadelta, {}), (torch.optim.Adagrad, {}), (torch.optim.ASGD, {}),
    (torch.optim.Rprop, {}), (torch.optim.RMSprop, {}), (torch.optim.RMSprop, {"momentum": 0.9}),
    (torch.optim.RMSprop, {"momentum": 0.9, "centered": True}), (torch.optim.SGD, {"lr": 0.1}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
]


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values()
               if isinstance(t, torch.Tensor))


def _model(dtype: torch.dtype) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)).to(dtype)
    model[1].bias.requires_grad_(False)  # frozen: no state
    return model


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(3, 8, dtype=next(model.parameters()).dtype)).sum().backward()
    optimizer.step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("cls", "options"), CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_pending_bytes_equal_what_the_first_step_allocates_and_nothing_after(cls, options, dtype):
    model = _model(dtype)
    optimizer = cls(model.parameters(), **options)
    before = _state_bytes(optimizer)
    predicted = pending_state_bytes(optimizer, "cpu")
    _step(model, optimizer)
    assert predicted == _state_bytes(optimizer) - before
    assert pending_state_bytes(optimizer, "cpu") == 0  # restored or stepped: nothing is pending


def test_scalars_stay_on_the_host_for_an_accelerator_unless_capturable():
    model = _model(torch.float32)
    parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert pending_state_bytes(torch.optim.AdamW(model.parameters()), "cuda") == 2 * 4 * parameters
    assert pending_state_bytes(torch.optim.AdamW(model.parameters()), "cpu") == 2 * 4 * parameters + 3 * 4


def test_wrappers_are_unwrapped_subclasses_counted_and_unknown_classes_are_none():
    model = _model(torch.float32)

    class Wrapper(torch.optim.Optimizer):  # as accelerate's AcceleratedOptimizer holds the real one
        def __init__(self, optimizer):
            self.optimizer = optimizer

    class MyAdamW(torch.optim.AdamW):
        pass

    class Unknown(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {})

    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert unwrap(Wrapper(Wrapper(inner))) is inner
    assert pending_state_bytes(Wrapper(inner), "cpu") == pending_state_bytes(inner, "cpu") > 0
    assert registered_counts(MyAdamW(model.parameters())) == registered_counts(torch.optim.AdamW(model.parameters()))
    assert pending_state_bytes(Unknown(model.parameters()), "cpu") is None
    hf_ckpt.register_optimizer_states(Unknown, lambda group: 3, scalars=0)
    try:
        assert pending_state_bytes(Unknown(model.parameters()), "cpu") == 3 * 4 * (8 * 16 + 16 + 16 * 4)
    finally:
        from hf_ckpt import _optimizer_states

        del _optimizer_states._REGISTRY[Unknown]
