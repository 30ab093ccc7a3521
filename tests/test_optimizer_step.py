"""What an optimizer's step allocates above its states (:mod:`hf_ckpt.meters.optimizer_step`), against real steps
of the optimizer the ``Trainer`` builds for each ``optim`` name, on the CPU: equal to the byte, first and second
step. bitsandbytes' names are measured in the clients environment (``tests/clients/test_optimizer_step_bnb.py``,
``python ci/clients.py``). The CUDA formulas are checked on hand-made parameter lists.
"""

from __future__ import annotations

import weakref

import pytest
import torch
import transformers

from hf_ckpt.meters.memory import StorageTracker
from hf_ckpt.meters.optimizer_states import LEGACY_OPTIMIZERS, TRAINER_OPTIMIZERS
from hf_ckpt.meters.optimizer_step import planned_step_bytes

#: Two shapes of a tiny Llama: MLP weights of 8192 elements (bitsandbytes' 8-bit state from 4096) the largest,
#: three in a row, and a large tied embedding, the first parameter, the largest.
MODELS = {"untied": {"vocab_size": 96, "tie_word_embeddings": False},
          "tied": {"vocab_size": 512, "tie_word_embeddings": True}}
CASES = [(model, torch.float32) for model in MODELS] + [("untied", torch.bfloat16)]


class _StepTracker(StorageTracker):
    """A :class:`StorageTracker` that also remembers each storage it saw made, weakly, with the bytes alive just
    after. What is still alive once the step is done is the optimizer's state: a first step makes it between the
    temporaries (the Trainer's second parameter group, each parameter of bitsandbytes and Adafactor), so the
    temporaries are the most alive at once less the state made so far, not the peak less all the state."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[weakref.ref, int, int]] = []

    def _track(self, storage: torch.UntypedStorage, label=None) -> None:
        new = id(storage) not in self._tracked
        super()._track(storage, label)
        if new:
            self.made.append((weakref.ref(storage), storage.nbytes(), self.live_bytes().get("cpu", 0)))

    def temporaries(self) -> int:
        state = most = 0
        for storage, nbytes, alive in self.made:
            state += nbytes if storage() is not None else 0
            most = max(most, alive - state)
        return most


def _model(kind: str, dtype: torch.dtype) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=64,
                                      **MODELS[kind])
    return transformers.LlamaForCausalLM(config).to(dtype)


def _measured_steps(optimizer: torch.optim.Optimizer) -> list[int]:
    temporaries = []
    for _ in range(2):
        with _StepTracker() as tracker:
            optimizer.step()
        temporaries.append(tracker.temporaries())
    return temporaries


#: bitsandbytes' names: measured in the clients environment (tests/clients/test_optimizer_step_bnb.py).
BNB_NAMES = [name for name in TRAINER_OPTIMIZERS if str(TRAINER_OPTIMIZERS[name].cls).startswith("bitsandbytes.")]


def check_measured_step(name: str, kind: str, dtype: torch.dtype, tmp_path) -> None:
    """The Trainer's optimizer for ``optim=name`` on a tiny model: each of two steps makes exactly the planned
    temporaries."""
    model = _model(kind, dtype)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), optim=name, use_cpu=True, report_to=[])
    optimizer = transformers.Trainer(model=model, args=args).create_optimizer()
    embeddings = {id(module.weight) for module in model.modules() if isinstance(module, torch.nn.Embedding)}
    trainable = [p for p in model.parameters() if p.requires_grad]
    for parameter in trainable:
        parameter.grad = torch.randn_like(parameter)
    planned = planned_step_bytes(name, [(tuple(p.shape), p.element_size(), id(p) in embeddings) for p in trainable],
                                 "cpu")
    assert _measured_steps(optimizer) == [planned, planned]


@pytest.mark.edge_releases
@pytest.mark.parametrize(("kind", "dtype"), CASES, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("name", [name for name in TRAINER_OPTIMIZERS if name not in BNB_NAMES])
def test_planned_step_bytes_equal_a_measured_step(name, kind, dtype, tmp_path):
    check_measured_step(name, kind, dtype, tmp_path)


#: Matrices of two sizes and a norm's weight, float32: the Trainer steps the one-dimensional weights apart.
_HANDMADE = [((96, 64), 4, True), ((128, 64), 4, False), ((64, 128), 4, False), ((64,), 4, False)]


@pytest.mark.any_release
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "xpu"])
def test_foreach_adamw_on_cuda_makes_one_copy_of_a_device_dtype_group(device):
    """``_multi_tensor_adam``'s ``torch._foreach_sqrt(exp_avg_sqs)``: every matrix's bytes (the norm's weight is in
    the Trainer's other parameter group, stepped after); fused AdamW and bitsandbytes' CUDA kernels make none."""
    matrices = (96 * 64 + 2 * 128 * 64) * 4
    assert planned_step_bytes("adamw_torch", _HANDMADE, device) == matrices
    assert planned_step_bytes("rmsprop", _HANDMADE, device) == matrices
    assert planned_step_bytes("adamw_torch", [((4096,), 2, False)], device) == 4096 * 2
    for name in ("adamw_torch_fused", "sgd", "adamw_bnb_8bit", "paged_ademamix_32bit"):
        assert planned_step_bytes(name, _HANDMADE, device) == 0


@pytest.mark.any_release
def test_foreach_holds_the_previous_dtype_groups_result_while_it_makes_the_next():
    mixed = [((128, 64), 4, False), ((128, 64), 2, False), ((64, 64), 2, False), ((32, 32), 8, False)]
    assert planned_step_bytes("adamw_torch", mixed, "cuda") == 128 * 64 * 4 + (128 * 64 + 64 * 64) * 2


@pytest.mark.any_release
def test_an_unknown_name_is_refused_naming_the_accepted_ones():
    with pytest.raises(ValueError, match=r"^optimizer must be one of adamw_torch, ") as refused:
        planned_step_bytes("lamb", _HANDMADE, "cpu")
    assert all(name in str(refused.value) for name in [*TRAINER_OPTIMIZERS, *LEGACY_OPTIMIZERS])
    assert str(refused.value).endswith("got 'lamb'")


@pytest.mark.any_release
def test_every_name_has_a_figure_on_either_device():
    for name in [*TRAINER_OPTIMIZERS, *LEGACY_OPTIMIZERS]:
        for device in ("cpu", "cuda"):
            assert planned_step_bytes(name, _HANDMADE, device) >= 0
