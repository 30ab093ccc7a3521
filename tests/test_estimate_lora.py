"""LoRA as PEFT configures it: target modules, dropout (each adapted module keeps its dropped input and mask),
``modules_to_save``, float32 adapters over a lower-precision base; from a ``LoraConfig`` and from the command's
``--lora-*`` flags. Measured against real CPU steps of a tiny Llama."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from hf_ckpt import cli
from hf_ckpt.estimation import estimate
from hf_ckpt.meters.step import measure_step

pytestmark = pytest.mark.edge_releases  # the matrix's ends only (tests/release_guard.py)

peft = pytest.importorskip("peft")

BATCH, SEQ = 2, 64


def _config():
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                                    num_hidden_layers=4, vocab_size=256, max_position_embeddings=256)


LORAS = {
    "q_v-dropout": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.05),
    "all-linear-dropout-lm_head": dict(r=8, target_modules="all-linear", lora_dropout=0.1, modules_to_save=["lm_head"]),
    "all-linear": dict(r=8, target_modules="all-linear", lora_dropout=0.0),
}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", LORAS)
def test_lora_estimate_matches_a_real_step(name, dtype):
    lora = peft.LoraConfig(**LORAS[name])
    torch.manual_seed(0)
    model = peft.get_peft_model(transformers.LlamaForCausalLM(_config()).to(dtype), lora).train()
    adapters = [p for p in model.parameters() if p.requires_grad]
    ids = torch.randint(3, 256, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    measured = measure_step(model, {"input_ids": ids, "labels": ids})
    made = estimate(_config(), batch_size=BATCH, seq_len=SEQ, dtype=dtype, device="cpu", peft_config=lora,
                    strategies=("none",))
    assert made.trainable_parameters == sum(p.numel() for p in adapters)
    assert made.gradients_bytes == sum(p.numel() * p.element_size() for p in adapters)  # float32 adapters
    assert made.activation_bytes["none"] == pytest.approx(measured.retained_bytes, rel=0.03)
    # the step's timeline: the backward as the gradients appear, above the parameters and the states (a measured
    # step has no optimizer)
    assert made.peak_phase["none"] != "the optimizer step"
    backward = made.peak_bytes["none"] - made.parameters_bytes - made.optimizer_bytes
    assert backward == pytest.approx(measured.peak_bytes, rel=0.03)


def test_dropout_keeps_each_adapted_modules_dropped_input():
    def made(dropout):
        lora = peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=dropout)
        return estimate(_config(), batch_size=BATCH, seq_len=SEQ, dtype="float32", device="cpu", peft_config=lora,
                        strategies=("none",)).activation_bytes["none"]

    # q_proj and v_proj read the same normed input: one dropped copy each (float32) and one bool mask each
    tokens, hidden, adapted = BATCH * SEQ, 64, 2 * 4
    assert made(0.05) - made(0.0) == adapted * tokens * hidden * (4 + 1)


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    folder = tmp_path_factory.mktemp("config")
    _config().save_pretrained(folder)
    return str(folder)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_command_flags_estimate_what_the_lora_config_does(config_path, tmp_path, capsys):
    path = tmp_path / "est.json"
    code = cli.main(["estimate", config_path, "--batch", str(BATCH), "--seq", str(SEQ), "--lora-r", "8",
                     "--lora-targets", "q_proj,v_proj", "--lora-alpha", "32", "--lora-dropout", "0.1",
                     "--lora-modules-to-save", "lm_head", "--strategies", "none,full", "--json", str(path)])
    assert code == 0
    lora = peft.LoraConfig(r=8, lora_alpha=32, target_modules=["q_proj", "v_proj"], lora_dropout=0.1,
                           modules_to_save=["lm_head"])
    made = estimate(config_path, batch_size=BATCH, seq_len=SEQ, peft_config=lora, strategies=("none", "full"))
    written = json.loads(path.read_text())
    for key in ("trainable_parameters", "gradients_bytes", "optimizer_bytes", "activation_bytes", "peak_bytes"):
        assert written[key] == getattr(made, key), key


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lora-dropout", "0.1"], "--lora-dropout needs --lora-r"),
        (["--lora-r", "8", "--lora-dropout", "1.5"], "--lora-dropout must be at least 0 and below 1; got 1.5"),
        (["--lora-r", "8", "--lora-targets", ","], "--lora-targets must name at least one module (comma-separated); "
                                                    "got ','"),
        (["--lora-r", "8", "--lora-targets", "nope"], "--lora-targets: Target modules {'nope'} not found"),
        (["--lora-r", "8", "--lora-modules-to-save", "nope"],
         "--lora-modules-to-save: modules_to_save nope not found in the model"),
    ],
)
def test_command_lora_errors_are_one_line(config_path, argv, message, capsys):
    code = cli.main(["estimate", config_path, "--batch", "1", "--seq", "8", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("hf-ckpt estimate: error: ") and message in err and err.count("\n") == 1
