"""``offload=True``: host-memory checkpoints where an accelerator exists, a clean fallback where none does."""

import warnings

import pytest
import torch
import torch.utils.checkpoint

import hf_ckpt
import hf_ckpt.runtime.functions
from hf_ckpt import HfCkptWarning
from hf_ckpt.runtime.blocks import find_blocks
from helpers import batch_for, max_grad_diff, recomputed_in_step, tiny_llama, train_step
from torch_capabilities import requires



def test_without_accelerator_runs_plain_checkpointing_and_warns_once(monkeypatch):
    monkeypatch.setattr("hf_ckpt.runtime.binding.current_accelerator", lambda: None)
    model = tiny_llama()
    batch = batch_for(model)
    reference = train_step(model, batch)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        hf_ckpt.enable(model, offload=True, every_n_layers=2)
        hf_ckpt.enable(model, offload=True, every_n_layers=2)
    [warning] = [str(w.message) for w in record if issubclass(w.category, HfCkptWarning) and "offload" in str(w.message)]
    assert "offload=True" in warning and "no accelerator" in warning  # once, naming the option and why
    assert _bound_checkpoint(model).func is torch.utils.checkpoint.checkpoint
    recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == [0, 2]
    assert max_grad_diff(reference, grads) <= 1e-5


def _bound_checkpoint(model):
    """The checkpoint partial governing block 0 (behind the stack's selecting wrapper on stack-flag models)."""
    bound = find_blocks(model)[0].owner._gradient_checkpointing_func
    return bound if bound.func is not hf_ckpt.runtime.functions.checkpoint_selected_blocks else bound.args[0]


@requires("cpu.Stream.wait_event")
def test_offload_code_path_on_cpu_with_pinning_off(monkeypatch):
    """With an accelerator the inputs saved for the recompute go to host memory through OverlappedOffload's side
    streams. Pinning needs an accelerator, so here the same path runs with the host standing in for the
    accelerator: streams and events are no-ops on CPU, copies synchronous, pin_memory off."""
    from hf_ckpt.runtime.offload import OverlappedOffload, _Packed

    monkeypatch.setattr("hf_ckpt.runtime.binding.current_accelerator", lambda: torch.device("cpu"))
    packed, unpacked = [], []
    original_pack, original_unpack = OverlappedOffload._pack, OverlappedOffload._unpack

    def pack(self, tensor):
        result = original_pack(self, tensor)
        packed.append(result)
        return result

    def unpack(self, handle):
        unpacked.append(handle)
        return original_unpack(self, handle)

    monkeypatch.setattr(OverlappedOffload, "_pack", pack)
    monkeypatch.setattr(OverlappedOffload, "_unpack", unpack)
    model = tiny_llama()
    batch = batch_for(model)
    reference = train_step(model, batch)
    hf_ckpt.enable(model, offload=True)
    bound = _bound_checkpoint(model)
    assert bound.func is hf_ckpt.runtime.functions.offloaded_checkpoint
    assert isinstance(bound.keywords["offloader"], OverlappedOffload)
    assert (bound.keywords["offloader"].device_type, bound.keywords["offloader"].pin_memory) == ("cpu", False)
    recomputed, grads = recomputed_in_step(model, batch)
    assert recomputed == [0, 1, 2, 3]
    offloaded = [p for p in packed if isinstance(p, _Packed)]
    assert offloaded and all(p.host.device.type == "cpu" for p in offloaded)
    # every block's hidden-state input went through a host copy and came back in backward
    assert {id(p) for p in unpacked if isinstance(p, _Packed)} == {id(p) for p in offloaded}
    assert len(offloaded) == 4  # one hidden-state input per block (the position embeddings are under min_bytes)
    assert max_grad_diff(reference, grads) <= 1e-5


@requires("cpu.Stream.wait_event")
def test_on_cpu_the_host_copies_count_apart_and_two_inputs_come_back_at_once(monkeypatch):
    """Measured on CPU as on an accelerator: the blocks' inputs live as host copies (StorageTracker's "host"), off
    the device count, from the end of forward; in backward each comes back as a new tensor, at most two at once (the
    one recomputed and the one prefetched)."""
    from hf_ckpt.meters.memory import HOST, StorageTracker

    monkeypatch.setattr("hf_ckpt.runtime.binding.current_accelerator", lambda: torch.device("cpu"))
    model = tiny_llama()
    batch = batch_for(model)
    inputs = batch["input_ids"].numel() * model.config.hidden_size * 4  # one block's float32 input
    figures = {}
    for offload in (False, True):
        hf_ckpt.enable(model, offload=offload)
        for parameter in model.parameters():
            parameter.grad = torch.zeros_like(parameter)
        with StorageTracker() as tracker:
            loss = model(**batch).loss
            retained = tracker.live_bytes()
            tracker.reset_peak()
            loss.backward()
            del loss
            figures[offload] = retained, tracker.peak_bytes()
    (plain, plain_peak), (offloaded, offloaded_peak) = figures[False], figures[True]
    assert HOST not in plain and offloaded[HOST] == 4 * inputs  # every block's input, copied once
    assert plain["cpu"] - offloaded["cpu"] == 4 * inputs
    assert offloaded_peak[HOST] == 4 * inputs
    # at the backward's peak two inputs are back on the device, where without offload all four still are
    assert plain_peak["cpu"] - offloaded_peak["cpu"] == 2 * inputs


@requires("cpu.Stream.wait_event")
@pytest.mark.any_release
def test_overlapped_offload_keeps_small_and_foreign_tensors_in_place():
    from hf_ckpt.runtime.offload import OverlappedOffload

    offload = OverlappedOffload("cpu", pin_memory=False, min_bytes=1024)
    small = torch.ones(4)
    assert offload._pack(small) is small
    meta = torch.empty(1024, device="meta")
    assert offload._pack(meta) is meta
    big = torch.arange(1024.0)
    handle = offload._pack(big)
    assert handle is not big and torch.equal(offload._unpack(handle), big)


@requires("cpu.Stream.wait_event")
@pytest.mark.any_release
def test_a_tensor_saved_by_several_checkpoints_is_copied_once():
    """Position embeddings reach every block: one host copy serves all, while the device tensor lives."""
    from hf_ckpt.runtime.offload import OverlappedOffload

    offload = OverlappedOffload("cpu", pin_memory=False, min_bytes=0)
    shared = torch.arange(64.0)
    first, second = offload._pack(shared), offload._pack(shared)
    assert first is second
    shared.add_(1)  # a new version is a new tensor for the recompute: copied again
    third = offload._pack(shared)
    assert third is not first and torch.equal(offload._unpack(third), shared)


@pytest.mark.slow
def test_the_warning_reaches_a_script_run_with_python_c():
    """``python -c`` code has no source a warning can quote: the warning is still shown (it once raised
    ImportError: '__main__' is not a built-in module)."""
    import subprocess
    import sys

    script = (
        "import hf_ckpt, torch\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, "
        "num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1))\n"
        "hf_ckpt.enable(model, offload=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    if torch.cuda.is_available():
        assert done.returncode == 0
        return
    assert done.returncode == 0, done.stderr
    assert "offload=True has no effect on this machine" in done.stderr


def test_a_device_whose_streams_cannot_wait_on_events_is_refused_at_the_call(monkeypatch):
    """torch 2.5's CPU stream has no wait_event: offload is refused when the setting is applied, naming it, and the
    model is left as it was (not an AttributeError inside the first backward)."""
    monkeypatch.setattr("hf_ckpt.runtime.binding.current_accelerator", lambda: torch.device("cpu"))
    monkeypatch.setattr(torch.cpu, "Stream", type("Stream", (), {}))  # a stream without wait_event
    model = tiny_llama()
    batch = batch_for(model)
    reference = train_step(model, batch)
    with pytest.raises(RuntimeError, match=r"offload=True on cpu needs torch\.cpu\.Stream\.wait_event"):
        hf_ckpt.enable(model, offload=True, every_n_layers=2)
    assert hf_ckpt.checkpointed_layers(model) == []
    assert max_grad_diff(reference, train_step(model, batch)) == 0
