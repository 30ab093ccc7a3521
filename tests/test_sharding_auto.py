"""``plan(..., batch_size=, seq_len=)`` and ``"auto"`` budgets under FSDP / DeepSpeed: the sharded estimate.

accelerate's state is what the ``Trainer`` leaves (``AcceleratorState``'s FSDP or DeepSpeed plugin, the number of
processes); here it is set as accelerate sets it, on its shared-state dictionaries, and restored after each test.
"""

from __future__ import annotations

import types

import pytest
import transformers

import hf_ckpt
from hf_ckpt.budget import from_estimate as _from_estimate
from hf_ckpt.estimation import estimate
from hf_ckpt.estimation._engine import detected_sharding, still_allocated

accelerate_state = pytest.importorskip("accelerate.state")
from accelerate.utils import DistributedType  # noqa: E402


@pytest.fixture
def accelerator(monkeypatch):
    """Set accelerate's shared state: ``accelerator(kind, processes, plugin)``."""
    def set_state(kind: DistributedType, processes: int, **plugins):
        monkeypatch.setattr(accelerate_state.PartialState, "_shared_state",
                            {"distributed_type": kind, "num_processes": processes})
        monkeypatch.setattr(accelerate_state.AcceleratorState, "_shared_state",
                            {"distributed_type": kind, **plugins})

    return set_state


def _fsdp_plugin(**kwargs):
    return types.SimpleNamespace(**{"fsdp_version": 2, "reshard_after_forward": True, "cpu_offload": False, **kwargs})


def _ds_plugin(zero: dict):
    return types.SimpleNamespace(hf_ds_config=types.SimpleNamespace(config={"zero_optimization": zero}))


def test_detected_from_accelerate_state(accelerator):
    accelerator(DistributedType.FSDP, 8, fsdp_plugin=_fsdp_plugin())
    assert detected_sharding() == {"world_size": 8, "shard": "fsdp-full", "offload_parameters": False}
    accelerator(DistributedType.FSDP, 4, fsdp_plugin=_fsdp_plugin(reshard_after_forward=False))
    assert detected_sharding()["shard"] == "fsdp-grad-op"
    accelerator(DistributedType.FSDP, 4, fsdp_plugin=_fsdp_plugin(fsdp_version=1, reshard_after_forward="SHARD_GRAD_OP"))
    assert detected_sharding()["shard"] == "fsdp-grad-op"
    accelerator(DistributedType.FSDP, 4, fsdp_plugin=_fsdp_plugin(fsdp_version=1, reshard_after_forward="NO_SHARD"))
    assert detected_sharding() == {}
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "none"}}
    accelerator(DistributedType.DEEPSPEED, 2, deepspeed_plugins={"default": _ds_plugin(zero)})
    assert detected_sharding() == {"world_size": 2, "shard": "zero3", "offload_optimizer": True,
                                   "offload_parameters": False}
    accelerator(DistributedType.DEEPSPEED, 1, deepspeed_plugins={"default": _ds_plugin(zero)})
    assert detected_sharding() == {}  # one process: nothing is sharded
    accelerator(DistributedType.MULTI_GPU, 8)
    assert detected_sharding() == {}


@pytest.fixture(scope="module")
def config():
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                    num_key_value_heads=2, num_hidden_layers=4, vocab_size=256,
                                    max_position_embeddings=64)


@pytest.mark.slow
def test_the_first_batch_estimate_is_sharded_under_fsdp(accelerator, config):
    model = transformers.LlamaForCausalLM(config).train()
    _from_estimate._estimates.clear()
    accelerator(DistributedType.FSDP, 4, fsdp_plugin=_fsdp_plugin())
    sharded, _device = _from_estimate.estimate_for(model, (2, 16), ("none", "full"))
    accelerator(DistributedType.NO, 1)
    whole, _device = _from_estimate.estimate_for(model, (2, 16), ("none", "full"))
    assert (sharded.shard, sharded.world_size, whole.shard) == ("fsdp-full", 4, "none")
    assert sharded.gradients_bytes < whole.gradients_bytes / 3
    # "auto" leaves room for the states the step still allocates: the shards and the gathers, not the whole
    sharded_room, details = still_allocated(sharded)
    assert "fsdp-full over 4" in details
    assert sharded_room == sharded.gradients_bytes + sharded.optimizer_bytes + sharded.gather_bytes
    assert still_allocated(whole)[0] == whole.gradients_bytes + whole.optimizer_bytes
    _from_estimate._estimates.clear()


@pytest.mark.slow
def test_plan_from_shapes_fits_the_device_per_rank(config):
    kwargs = dict(batch_size=2, seq_len=16, dtype="float32", device="cpu", whole_step=True)
    whole = estimate(config, batch_size=2, seq_len=16, dtype="float32", device="cpu", strategies=("none", "full"))
    sharded = estimate(config, batch_size=2, seq_len=16, dtype="float32", device="cpu", strategies=("none", "full"),
                       world_size=4, shard="fsdp-full")
    # a device too small for the whole model's states with full checkpointing, large enough per rank
    device = whole.peak_bytes["full"] - 1
    assert sharded.peak_bytes["full"] < device
    with pytest.raises(ValueError, match="no plan fits"):
        hf_ckpt.plan(config, budget=f"{device}B", **kwargs)
    made = hf_ckpt.plan(config, budget=f"{device}B", world_size=4, shard="fsdp-full", **kwargs)
    assert made.predicted_bytes + sharded.fixed_bytes + max(sharded.transient_bytes.values()) <= device
