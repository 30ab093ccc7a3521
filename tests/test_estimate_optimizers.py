"""The estimate's optimizer states by the ``Trainer``'s ``optim`` names, against the state the optimizer the
``Trainer`` builds allocates in a real first step (CPU, a tiny model): equal to the byte.

The table is the one ``budget="auto"`` counts live optimizers with (:mod:`hf_ckpt.meters.optimizer_states`);
bitsandbytes' names are compared in ``tests/clients/test_bitsandbytes.py``.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from hf_ckpt.estimation import estimate

pytestmark = pytest.mark.edge_releases  # the matrix's ends only (tests/release_guard.py)

LEGACY = {"adamw": (torch.optim.AdamW, {}), "adam": (torch.optim.Adam, {}),
          "sgd_momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9})}


def _config():
    return transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                                    num_hidden_layers=2, vocab_size=128, max_position_embeddings=64)


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)}
    return sum(storages.values())


def _trainer_optimizer(model, name: str, tmp_path):
    if name in LEGACY:
        cls, options = LEGACY[name]
        return cls(model.parameters(), **options)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), optim=name, use_cpu=True, report_to=[])
    trainer = transformers.Trainer(model=model, args=args)
    return trainer.create_optimizer()


@pytest.mark.parametrize("name", ["adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "rmsprop", *LEGACY])
def test_optimizer_bytes_equal_the_first_step_of_the_trainers_optimizer(name, tmp_path):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config())
    optimizer = _trainer_optimizer(model, name, tmp_path)
    ids = torch.randint(0, 128, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    made = estimate(_config(), batch_size=2, seq_len=8, dtype="float32", device="cpu", optimizer=name,
                    strategies=("none",))
    assert made.optimizer == name
    assert made.optimizer_bytes == _state_bytes(optimizer)
    assert (made.optimizer_bytes > 0) == (name != "sgd")  # the Trainer's SGD has no momentum: no state


def test_names_are_read_case_insensitively():
    made = estimate(_config(), batch_size=1, seq_len=8, optimizer="AdamW_Torch_Fused", strategies=("none",))
    assert made.optimizer == "adamw_torch_fused"


def test_an_8bit_optimizer_under_a_shard_is_refused_naming_why():
    with pytest.raises(ValueError, match=r"^optimizer: adamw_8bit under shard='zero3' is not modelled"):
        estimate(_config(), batch_size=1, seq_len=8, optimizer="adamw_8bit", world_size=2, shard="zero3",
                 strategies=("none",))


def test_fused_adamw_keeps_its_step_counters_on_the_device():
    """``adamw_torch_fused`` (the Trainer's default on recent torch): its float32 ``step`` per parameter tensor is
    device memory, as it is for a capturable AdamW (``tests/test_optimizer_states.py``); plain AdamW's stays on the
    host."""
    tensors = sum(1 for p in transformers.LlamaForCausalLM(_config()).parameters())
    fused, plain = (estimate(_config(), batch_size=1, seq_len=8, device="cuda", optimizer=name, strategies=("none",))
                    for name in ("adamw_torch_fused", "adamw_torch"))
    assert fused.optimizer_bytes - plain.optimizer_bytes == 4 * tensors
