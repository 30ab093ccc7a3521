"""The torch.compile reference of the op-level benches (hf_ckpt.measure._compiled): it counts the random ops its
compiled backward draws afresh (pytorch/pytorch#190758: dropout masks in backward that are not the forward's), and
``compile_seeded:F`` keeps the seeds, so that its backward replays the forward's masks."""

import math
import shutil
import warnings

import pytest
import torch
from torch import nn

from hf_ckpt.measure.settings import parse_setting
from hf_ckpt.measure._compiled import CompiledReference, compile_unavailable, seeded_unavailable

_UNAVAILABLE = compile_unavailable() or seeded_unavailable() or (
    None if any(shutil.which(c) for c in ("g++", "clang++", "c++")) else "inductor on a CPU needs a C++ compiler"
)
pytestmark = pytest.mark.skipif(_UNAVAILABLE is not None, reason=str(_UNAVAILABLE))


class _Dropped(nn.Module):
    """``loss = sum(dropout(exp(a)))``: with p = 0.5, ``loss = 2 * sum(exp(a) * forward mask)`` and
    ``a.grad = 2 * exp(a) * backward mask``, so ``a.grad.sum() == loss`` exactly when the two masks agree."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.rand(128, 128, generator=torch.Generator().manual_seed(0)) + 0.1)
        self.drop = nn.Dropout(0.5)

    def forward(self) -> dict:
        return {"loss": self.drop(self.a.exp()).sum()}


def _compiled_step(reference: CompiledReference) -> tuple[float, float]:
    model = _Dropped()
    reference.prepare(model, {}, lambda: model()["loss"].backward())
    reference.apply(model)
    try:
        model.zero_grad(set_to_none=True)
        loss = model()["loss"]
        loss.backward()
    finally:
        reference.remove(model)
    return float(loss.detach()), float(model.a.grad.sum())


def _agree(loss: float, gradient_sum: float) -> bool:
    return math.isclose(loss, gradient_sum, rel_tol=1e-5)


@pytest.mark.parametrize("budget", [0.0, 0.5])
def test_the_count_of_random_ops_drawn_afresh_in_backward_is_what_the_gradients_show(budget):
    """As torch ships it, compile's backward may draw dropout masks again; the count says so exactly when the
    gradient does not match the forward's mask (whichever way a torch release behaves)."""
    reference = CompiledReference(budget)
    loss, gradient_sum = _compiled_step(reference)
    assert (reference.backward_random > 0) == (not _agree(loss, gradient_sum))


@pytest.mark.parametrize("budget", [0.01, 0.5])
def test_compile_seeded_replays_the_forwards_dropout_masks(budget):
    reference = CompiledReference(budget, keep_random=True)
    loss, gradient_sum = _compiled_step(reference)
    assert reference.backward_random == 0
    assert _agree(loss, gradient_sum)


def test_compile_seeded_needs_a_budget_above_zero():
    with pytest.raises(ValueError, match="keep_random needs an activation_memory_budget above 0"):
        CompiledReference(0.0, keep_random=True)
    with pytest.raises(ValueError, match=r"compile_seeded needs .* in \(0, 1\].* got compile_seeded:0$"):
        parse_setting("compile_seeded:0")
    with pytest.raises(ValueError, match=r"compile_seeded needs .* got compile_seeded:half$"):
        parse_setting("compile_seeded:half")
    assert parse_setting("compile_seeded:0.5").name == "compile_seeded:0.5"


def test_the_bench_setting_records_and_warns_once_where_compile_draws_random_afresh():
    model = _Dropped()
    setting = parse_setting("compile:0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        setting.prepare(model, {})
    fresh = setting.details["backward_random"]
    messages = [str(w.message) for w in caught if "pytorch/pytorch#190758" in str(w.message)]
    if fresh:
        assert messages == [
            f"compile:0: the compiled backward draws {fresh} random op(s) afresh (pytorch/pytorch#190758): its "
            "dropout masks are not the forward's, so its gradients are wrong and its saved bytes leave out what a "
            "correct replay keeps; compile_seeded:F (F in (0, 1]) keeps the seeds."
        ]
    else:
        assert messages == []
    assert sorted(setting.details) == ["backward_random", "graph_flops", "saved_bytes"]
    assert setting.details["graph_flops"] == 0  # no matmul: FLOPs count matmul-class ops only
