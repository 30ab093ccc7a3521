"""What an optimizer's first step allocates (``budget="auto"`` leaves room for it), against real first steps.

bitsandbytes' optimizers are tested the same way in ``tests/clients/test_bitsandbytes.py`` (clients environment).
"""

from __future__ import annotations

import pytest
import torch

import hf_ckpt
from hf_ckpt.meters import optimizer_states as _optimizer_states
from hf_ckpt.meters.optimizer_states import pending_state_bytes, registered_state_bytes, unwrap
from torch_capabilities import requires


def _transformers_adafactor(params, **options):
    from transformers.optimization import Adafactor

    return Adafactor(params, lr=1e-3, relative_step=False, **options)


CASES = [
    (torch.optim.Adam, {}), (torch.optim.Adam, {"amsgrad": True}), (torch.optim.AdamW, {}),
    (torch.optim.AdamW, {"amsgrad": True}), (torch.optim.NAdam, {}), (torch.optim.RAdam, {}),
    (torch.optim.Adamax, {}), (torch.optim.Adadelta, {}), (torch.optim.Adagrad, {}), (torch.optim.ASGD, {}),
    (torch.optim.Rprop, {}), (torch.optim.RMSprop, {}), (torch.optim.RMSprop, {"momentum": 0.9}),
    (torch.optim.RMSprop, {"momentum": 0.9, "centered": True}), (torch.optim.SGD, {"lr": 0.1}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    pytest.param(getattr(torch.optim, "Adafactor", None), {}, marks=requires("optim.Adafactor"), id="Adafactor"),
    (_transformers_adafactor, {}), (_transformers_adafactor, {"beta1": 0.9}),
]


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the distinct tensor storages in the optimizer's state."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)}
    return sum(storages.values())


class _Model(torch.nn.Module):
    """Parameters of one, two and three dimensions (Adafactor factors the last two), one of them frozen."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.first, self.second = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
        self.cube = torch.nn.Parameter(torch.randn(3, 4, 5))
        self.second.bias.requires_grad_(False)  # frozen: no state
        self.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x)).sum() + self.cube.square().sum()


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(3, 8, dtype=next(model.parameters()).dtype)).backward()
    optimizer.step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("cls", "options"), CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_pending_bytes_equal_what_the_first_step_allocates_and_nothing_after(cls, options, dtype):
    model = _Model(dtype)
    optimizer = cls(model.parameters(), **options)
    before = _state_bytes(optimizer)
    predicted = pending_state_bytes(optimizer)
    _step(model, optimizer)
    assert predicted == _state_bytes(optimizer) - before
    assert pending_state_bytes(optimizer) == 0  # restored or stepped: nothing is pending


@requires("optim.Muon")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_muon_two_dimensional_parameters(dtype):
    weights = [torch.nn.Parameter(torch.randn(6, 5, dtype=dtype)), torch.nn.Parameter(torch.randn(4, 6, dtype=dtype))]
    optimizer = torch.optim.Muon(weights)
    predicted = pending_state_bytes(optimizer)
    (weights[1] @ weights[0]).sum().backward()
    optimizer.step()
    assert predicted == _state_bytes(optimizer) == (30 + 24) * weights[0].element_size()


def test_sparse_adam_on_a_sparse_embedding():
    embedding = torch.nn.Embedding(10, 4, sparse=True)
    optimizer = torch.optim.SparseAdam(embedding.parameters())
    predicted = pending_state_bytes(optimizer)
    embedding(torch.tensor([1, 2])).sum().backward()
    optimizer.step()
    assert predicted == _state_bytes(optimizer) == 2 * 10 * 4 * 4


def test_host_scalars_count_only_with_parameters_on_the_host_or_capturable():
    on_cpu = torch.nn.Linear(8, 16)
    on_accelerator = torch.nn.Linear(8, 16, device="meta")  # a device other than the host, as cuda is
    parameters = 8 * 16 + 16
    assert pending_state_bytes(torch.optim.AdamW(on_cpu.parameters())) == 2 * 4 * parameters + 2 * 4
    assert pending_state_bytes(torch.optim.AdamW(on_accelerator.parameters())) == 2 * 4 * parameters
    capturable = torch.optim.AdamW(on_accelerator.parameters(), capturable=True)
    assert pending_state_bytes(capturable) == 2 * 4 * parameters + 2 * 4


def test_wrappers_are_unwrapped_subclasses_counted_and_unknown_classes_are_none():
    model = _Model(torch.float32)

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
    assert pending_state_bytes(Wrapper(inner)) == pending_state_bytes(inner) > 0
    assert registered_state_bytes(MyAdamW(model.parameters())) is registered_state_bytes(
        torch.optim.AdamW(model.parameters()))
    assert pending_state_bytes(Unknown(model.parameters())) is None
    trainable = 8 * 16 + 16 + 16 * 4 + 3 * 4 * 5
    for key in (Unknown, f"{Unknown.__module__}.{Unknown.__qualname__}"):  # the class, or its dotted name
        hf_ckpt.register_optimizer_states(key, lambda optimizer, group, p: 3 * p.numel() * p.element_size())
        try:
            assert pending_state_bytes(Unknown(model.parameters())) == 3 * 4 * trainable
        finally:
            del _optimizer_states._REGISTRY[key]


@pytest.mark.any_release
def test_registering_bad_arguments_names_them():
    with pytest.raises(TypeError, match=r"^cls must be an optimizer class or its dotted name \('package\.module\.Class'\); got 'Lion'$"):
        hf_ckpt.register_optimizer_states("Lion", lambda optimizer, group, p: 0)
    with pytest.raises(TypeError, match=r"^state_bytes must be a callable \(optimizer, group, parameter\) -> int; got int$"):
        hf_ckpt.register_optimizer_states(torch.optim.SGD, 2)
    assert registered_state_bytes(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)) is not None
