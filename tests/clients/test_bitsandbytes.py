"""bitsandbytes' optimizers (8-bit and 32-bit, paged or not) and ``budget="auto"``: what their first step
allocates is predicted to the byte, and the stock ``Trainer`` with ``optim="adamw_bnb_8bit"`` plans for it.

Runs in the clients environment (``python ci/clients.py``); skipped where bitsandbytes is not installed.
"""

from __future__ import annotations

import warnings

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")

import hf_ckpt  # noqa: E402
from hf_ckpt.budget import forms as _budget, from_estimate as _from_estimate  # noqa: E402
from hf_ckpt.meters.optimizer_states import pending_state_bytes, unwrap  # noqa: E402
from hf_ckpt.runtime.state import get_state  # noqa: E402
from helpers import VOCAB, tiny_llama  # noqa: E402

optim = bnb.optim
CASES = [
    (optim.AdamW, {"optim_bits": 8}), (optim.AdamW, {"optim_bits": 32}), (optim.Adam8bit, {}),
    (optim.PagedAdamW8bit, {}), (optim.Lion8bit, {}), (optim.Lion, {}),
    (optim.SGD8bit, {"lr": 0.1, "momentum": 0.9}), (optim.RMSprop8bit, {"lr": 0.01}),
    (optim.Adagrad8bit, {"lr": 0.01}), (optim.LAMB8bit, {}),  # LAMB: max_unorm=1.0, a unorm_vec
    (optim.LARS8bit, {"lr": 0.1, "momentum": 0.9}),
    (optim.AdEMAMix8bit, {}), (optim.AdEMAMix, {}),
]


def _state_bytes(optimizer) -> int:
    """Distinct tensor storages of the state, less the quantization maps that all parameters share."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for state in optimizer.state.values() for key, t in state.items()
                if isinstance(t, torch.Tensor) and not key.startswith("qmap")}
    return sum(storages.values())


@pytest.mark.parametrize(("cls", "options"), CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_pending_bytes_equal_what_the_first_step_allocates(cls, options):
    # 8-bit state from 4096 elements (min_8bit_size); the bias and a 4095-element weight keep float32 state
    layers = torch.nn.Sequential(torch.nn.Linear(64, 80), torch.nn.Linear(80, 4, bias=False),
                                 torch.nn.Linear(4, 1023, bias=False))
    optimizer = cls(layers.parameters(), **options)
    predicted = pending_state_bytes(optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # paged optimizers say they are not paged on the CPU
        layers(torch.randn(3, 64)).sum().backward()
        optimizer.step()
    assert predicted == _state_bytes(optimizer) > 0
    assert pending_state_bytes(optimizer) == 0


def test_auto_in_the_trainer_leaves_room_for_adamw_8bit(patched, tmp_path):
    """``optim="adamw_bnb_8bit"``: the budget is told the Trainer's optimizer and plans with its states (float32
    for the tiny model's parameters under bitsandbytes' ``min_8bit_size``, and no ``step`` tensors), without a
    warning."""
    from transformers import Trainer, TrainingArguments

    model = tiny_llama()
    made = _from_estimate.estimate_for(model, (2, 16), ("none", "full", "selective"))[0]
    total, activations = 8 * 2**30, made.activation_bytes["none"] // 2
    args = TrainingArguments(
        output_dir=str(tmp_path), gradient_checkpointing=True, gradient_checkpointing_kwargs={"budget": "auto"},
        max_steps=1, per_device_train_batch_size=2, learning_rate=0.0, report_to=[], use_cpu=True,
        optim="adamw_bnb_8bit", save_strategy="no", logging_strategy="no", dataloader_num_workers=0,
    )
    data = [{"input_ids": ids, "labels": ids.clone()} for ids in torch.randint(1, VOCAB, (4, 16))]
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.create_optimizer()
    states = pending_state_bytes(trainer.optimizer)
    assert 0 < states != made.optimizer_bytes  # AdamW's, as assumed for an unknown optimizer
    previous = _budget.set_free_memory_source(lambda device: (
        _budget.headroom(total) + made.held_above_bytes[""] - made.parameters_bytes - made.optimizer_bytes + states
        + activations,
        total))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", hf_ckpt.HfCkptWarning)
            trainer.train()
    finally:
        _budget.set_free_memory_source(previous)
    request = get_state(model).budget
    assert type(unwrap(request.optimizer())) is optim.AdamW
    assert request.auto_bytes == activations


@pytest.mark.parametrize("name", ["adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit", "lion_8bit",
                                  "paged_adamw_32bit", "ademamix_8bit"])
def test_estimate_by_optim_name_equals_the_trainers_first_step(name, tmp_path):
    """``hf_ckpt.estimate(optimizer=name)`` counts what the Trainer's ``optim=name`` allocates, to the byte:
    8-bit state with a float32 scale per 256 elements from 4096 elements, float32 below, and the Trainer's
    32-bit override of embeddings."""
    import transformers

    def config():
        return transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                        num_key_value_heads=2, num_hidden_layers=2, vocab_size=96,
                                        max_position_embeddings=64)

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config())
    args = transformers.TrainingArguments(output_dir=str(tmp_path), optim=name, use_cpu=True, report_to=[])
    optimizer = transformers.Trainer(model=model, args=args).create_optimizer()
    ids = torch.randint(0, 96, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimizer.step()
    made = hf_ckpt.estimate(config(), batch_size=2, seq_len=8, dtype="float32", device="cpu", optimizer=name,
                            strategies=("none",))
    assert made.optimizer_bytes == _state_bytes(unwrap(optimizer)) > 0
