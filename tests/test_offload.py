"""``offload=True``: host-memory checkpoints where an accelerator exists, a clean fallback where none does."""

import functools
import re
import warnings

import torch
import torch.utils.checkpoint

import hf_ckpt
import hf_ckpt.functions
from hf_ckpt import HfCkptWarning
from hf_ckpt.blocks import find_blocks
from helpers import batch_for, max_grad_diff, recomputed_in_step, tiny_llama, train_step

NO_ACCELERATOR = (
    "offload=True has no effect on this machine: there is no accelerator, so activations already live in host "
    "memory. Running plain activation checkpointing."
)


def test_without_accelerator_runs_plain_checkpointing_and_warns_once(monkeypatch):
    monkeypatch.setattr("hf_ckpt.core.current_accelerator", lambda: None)
    model = tiny_llama()
    batch = batch_for(model)
    reference = train_step(model, batch)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        hf_ckpt.enable(model, offload=True, every_n_layers=2)
        hf_ckpt.enable(model, offload=True, every_n_layers=2)
    assert [str(w.message) for w in record if issubclass(w.category, HfCkptWarning) and "offload" in str(w.message)] == [
        NO_ACCELERATOR
    ]
    assert _bound_checkpoint(model).func is torch.utils.checkpoint.checkpoint
    recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == [0, 2]
    assert max_grad_diff(reference, grads) <= 1e-5


def _bound_checkpoint(model):
    """The checkpoint partial governing block 0 (behind the stack's selecting wrapper on stack-flag models)."""
    bound = find_blocks(model)[0].owner._gradient_checkpointing_func
    return bound if bound.func is not hf_ckpt.functions.checkpoint_selected_blocks else bound.args[0]


class _CountingSaveOnCpu(torch.autograd.graph.save_on_cpu):
    packed = 0

    def __init__(self, pin_memory=False, **kwargs):
        super().__init__(pin_memory=pin_memory, **kwargs)
        pack = self.pack_hook

        def counting_pack(tensor):
            type(self).packed += 1
            return pack(tensor)

        self.pack_hook = counting_pack


def test_offload_code_path_on_cpu_with_pinning_off(monkeypatch):
    """With an accelerator the inputs saved for the recompute go through ``save_on_cpu``. Pinning needs an
    accelerator, so here the path runs with pin_memory=False and the host device standing in for the accelerator."""
    monkeypatch.setattr("hf_ckpt.core.current_accelerator", lambda: torch.device("cpu"))
    monkeypatch.setattr("hf_ckpt.functions.save_on_cpu", _CountingSaveOnCpu)
    model = tiny_llama()
    batch = batch_for(model)
    reference = train_step(model, batch)
    hf_ckpt.enable(model, offload=True)
    bound = _bound_checkpoint(model)
    assert bound.func is hf_ckpt.functions.offloaded_checkpoint
    assert bound.keywords == {"pin_memory": False, "device_type": "cpu", "use_reentrant": False}
    _CountingSaveOnCpu.packed = 0
    recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == [0, 1, 2, 3]
    assert _CountingSaveOnCpu.packed > 0
    assert max_grad_diff(reference, grads) <= 1e-5
