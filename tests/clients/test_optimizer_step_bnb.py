"""bitsandbytes' optimizers, as the ``Trainer`` builds them for each of their ``optim`` names: each step on the CPU
makes exactly the temporaries :func:`hf_ckpt.meters.optimizer_step.planned_step_bytes` plans (the torch and
transformers names: ``tests/test_optimizer_step.py``). Runs in the clients environment (``python ci/clients.py``)."""

from __future__ import annotations

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")

from test_optimizer_step import BNB_NAMES, CASES, check_measured_step  # noqa: E402


@pytest.fixture
def bnb_kernels_in_python(monkeypatch):
    """bitsandbytes' CPU optimizer kernels called as plain Python: a custom op's kernel runs with dispatch modes
    off, so the tracker would see none of the torch ops inside it."""
    from bitsandbytes.backends.cpu import ops

    monkeypatch.setattr(torch.ops.bitsandbytes, "optimizer_update_32bit", ops._optimizer_update_32bit_cpu)
    monkeypatch.setattr(torch.ops.bitsandbytes, "optimizer_update_8bit_blockwise",
                        ops._optimizer_update_8bit_blockwise_cpu)


@pytest.mark.parametrize(("kind", "dtype"), CASES, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("name", BNB_NAMES)
@pytest.mark.filterwarnings("ignore::UserWarning")  # bitsandbytes: a paged optimizer is not paged on the CPU
def test_planned_step_bytes_equal_a_measured_step(name, kind, dtype, tmp_path, bnb_kernels_in_python):
    check_measured_step(name, kind, dtype, tmp_path)
