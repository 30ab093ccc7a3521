"""The step as a timeline with bitsandbytes' 8-bit and paged optimizers, as the ``Trainer`` builds them: the
estimate's first and steady step within 3 % of real CPU steps (``tests/test_estimate_timeline.py`` for the other
settings). Runs in the clients environment (``python ci/clients.py``)."""

from __future__ import annotations

import pytest
import torch
import transformers

bnb = pytest.importorskip("bitsandbytes")

import hf_ckpt  # noqa: E402
from hf_ckpt.estimation import estimate  # noqa: E402
from test_estimate_timeline import _LLAMA, BATCH, SEQ, _measured  # noqa: E402


@pytest.fixture
def bnb_kernels_in_python(monkeypatch):
    """bitsandbytes' CPU optimizer kernels called as plain Python, so that the tracker sees what they allocate."""
    from bitsandbytes.backends.cpu import ops

    monkeypatch.setattr(torch.ops.bitsandbytes, "optimizer_update_32bit", ops._optimizer_update_32bit_cpu)
    monkeypatch.setattr(torch.ops.bitsandbytes, "optimizer_update_8bit_blockwise",
                        ops._optimizer_update_8bit_blockwise_cpu)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("optim", ["adamw_8bit", "paged_adamw_8bit", "lion_8bit"])
@pytest.mark.parametrize("row", ["none", "full"])
def test_first_and_steady_step_with_bitsandbytes_optimizers(optim, row, tmp_path, bnb_kernels_in_python):
    config = transformers.LlamaConfig(**{**_LLAMA, "intermediate_size": 256}, architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).train()  # MLP weights of 16,384 elements: 8-bit states
    ids = torch.randint(3, 256, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    if row == "full":
        hf_ckpt.enable(model)
    first, steady = _measured(model, {"input_ids": ids, "labels": ids}, optim, tmp_path)
    made = estimate(config, batch_size=BATCH, seq_len=SEQ, dtype="float32", device="cpu", optimizer=optim,
                    strategies=(row,))
    params = made.parameters_bytes
    assert made.first_step_peak_bytes[row] - params == pytest.approx(first, rel=0.03), made.peak_phase[row]
    assert made.peak_bytes[row] - params == pytest.approx(steady, rel=0.03), made.peak_phase[row]
