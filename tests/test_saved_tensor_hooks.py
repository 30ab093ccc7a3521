"""Selective and op-level strategies under an outer saved-tensor hook: the same on every torch, no FutureWarning.

torch 2.14 added ``respect_saved_tensors_hooks`` to ``torch.utils.checkpoint.checkpoint``: whether the tensors
selective checkpointing saves go through the saved-tensor hooks active around it (``save_on_cpu``, hf_ckpt's
offload). Its default keeps torch 2.13's behaviour (they bypass the hooks) and warns (FutureWarning) whenever such a
hook is active. hf_ckpt passes ``False`` by capability (see ``hf_ckpt.strategies.selective.policy.selective_contexts``): the hook sees
the same tensors as on torch 2.13, and no warning reaches the user; ``respect_saved_tensors_hooks=True`` opts in.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import hf_ckpt
from hf_ckpt.runtime.blocks import find_blocks
from helpers import batch_for, max_grad_diff, tiny_llama, train_step
from torch_capabilities import requires

SAVED_BY_POLICY = ("aten.mm.default#0", "aten.mm.default#1", "aten.mm.default#2")


def _enable(model, setting: str, **kwargs) -> None:
    if setting == "oplevel":
        blocks = len(find_blocks(model))
        plan = hf_ckpt.CheckpointPlan(strategies=("oplevel:p",) * blocks, policies={"p": SAVED_BY_POLICY})
        hf_ckpt.enable(model, plan=plan, **kwargs)
    else:
        hf_ckpt.enable(model, strategy=setting, **kwargs)


def _step_under_hook(model, batch) -> tuple[int, dict[str, torch.Tensor]]:
    """One training step inside an outer ``saved_tensors_hooks``: how many tensors it packed, and the gradients.
    Any FutureWarning raised on the way is an error."""
    packed = 0

    def pack(tensor):
        nonlocal packed
        packed += 1
        return tensor

    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(123)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = model(**batch).loss
        loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return packed, grads


@pytest.mark.parametrize("setting", ["selective", "oplevel"])
def test_an_outer_hook_sees_what_it_sees_under_full_checkpointing_and_nothing_warns(setting):
    model = tiny_llama()
    batch = batch_for(model)
    reference = train_step(model, batch)
    hf_ckpt.enable(model, strategy="full")
    packed_full, _ = _step_under_hook(model, batch)
    hf_ckpt.disable(model)
    _enable(model, setting)
    packed, grads = _step_under_hook(model, batch)
    # the tensors selective checkpointing keeps bypass the outer hook, as on torch <= 2.13
    assert packed == packed_full
    assert max_grad_diff(reference, grads) <= 1e-5


@requires("cpu.Stream.wait_event")
@pytest.mark.parametrize("setting", ["selective", "oplevel"])
def test_selective_and_oplevel_under_offload_warn_nothing(monkeypatch, setting):
    monkeypatch.setattr("hf_ckpt.runtime.binding.current_accelerator", lambda: torch.device("cpu"))
    model = tiny_llama()
    batch = batch_for(model)
    reference = train_step(model, batch)
    _enable(model, setting, offload=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        grads = train_step(model, batch)
    assert max_grad_diff(reference, grads) <= 1e-5


@requires("checkpoint.respect_saved_tensors_hooks")
def test_respect_saved_tensors_hooks_true_is_the_users_opt_in():
    model = tiny_llama()
    batch = batch_for(model)
    reference = train_step(model, batch)
    hf_ckpt.enable(model, strategy="selective")
    packed_default, _ = _step_under_hook(model, batch)
    hf_ckpt.disable(model)
    hf_ckpt.enable(model, strategy="selective", respect_saved_tensors_hooks=True)
    packed, grads = _step_under_hook(model, batch)
    assert packed > packed_default  # the kept matmul outputs now go through the hook too
    assert max_grad_diff(reference, grads) <= 1e-5
