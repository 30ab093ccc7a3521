"""A quantized base (QLoRA) in the estimate: what is refused, at the call, and the command's ``--quantize`` flags.

The figures themselves are measured against bitsandbytes on the CPU in ``tests/clients/test_qlora.py``.
"""

from __future__ import annotations

import re

import pytest
import torch
import transformers

from hf_ckpt import cli
from hf_ckpt.estimation import estimate

pytestmark = pytest.mark.edge_releases  # the matrix's ends only (tests/release_guard.py)

peft = pytest.importorskip("peft")


def _needs_bitsandbytes() -> bool:
    """Whether this release's ``BitsAndBytesConfig`` reads bitsandbytes' version (before transformers 5)."""
    from importlib.metadata import PackageNotFoundError

    try:
        transformers.BitsAndBytesConfig(load_in_4bit=True)
    except PackageNotFoundError:
        return True
    return False


if _needs_bitsandbytes():  # checked here: the cases below build configs when the module loads
    pytest.skip("this transformers release's BitsAndBytesConfig needs bitsandbytes installed (the clients environment "
                "runs tests/clients/test_qlora.py)", allow_module_level=True)


def _config():
    return transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                                    num_hidden_layers=2, vocab_size=128, max_position_embeddings=64)


def _four_bit(**options):
    return transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16, **options)


LORA = peft.LoraConfig(r=4, target_modules="all-linear")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"quantization_config": {"load_in_4bit": True}, "peft_config": LORA},
         "quantization_config must be a transformers.BitsAndBytesConfig (load_in_4bit=True or load_in_8bit=True) or "
         "None; got dict"),
        ({"quantization_config": _four_bit()},
         "quantization_config: a quantized base trains only adapters; pass peft_config (e.g. peft.LoraConfig: QLoRA)"),
        ({"quantization_config": transformers.BitsAndBytesConfig(load_in_4bit=True), "peft_config": LORA},
         "quantization_config: bnb_4bit_compute_dtype float32 differs from the training dtype bfloat16; only a "
         "compute dtype equal to it is modelled (set bnb_4bit_compute_dtype to the dtype)"),
        ({"quantization_config": _four_bit(), "peft_config": LORA, "world_size": 2, "shard": "fsdp-full"},
         "quantization_config: a quantized base under shard='fsdp-full' is not modelled; estimate it with "
         "shard='none'"),
    ],
)
def test_bad_quantization_fails_at_the_call_naming_the_argument(kwargs, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        estimate(_config(), batch_size=1, seq_len=8, strategies=("none",), **kwargs)


def test_the_estimate_says_the_base_is_quantized():
    made = estimate(_config(), batch_size=1, seq_len=8, strategies=("none",), peft_config=LORA,
                    quantization_config=_four_bit(bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True))
    assert made.quantization == "4bit nf4, double quant, compute bfloat16"
    assert "LORA on a 4bit nf4, double quant, compute bfloat16 base" in str(made)
    assert made.to_dict()["quantization"] == made.quantization


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    folder = tmp_path_factory.mktemp("config")
    _config().save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--quantize", "3bit"], "--quantize must be 4bit or 8bit; got '3bit'"),
        (["--quant-type", "nf4"], "--quant-type needs --quantize 4bit"),
        (["--quantize", "8bit", "--double-quant"], "--double-quant applies to --quantize 4bit only"),
        (["--quantize", "4bit", "--quant-type", "int4"], "--quant-type must be nf4 or fp4; got 'int4'"),
        (["--quantize", "4bit"], "--quantize: a quantized base trains only adapters; pass peft_config"),
        (["--quantize", "4bit", "--lora-r", "4", "--quant-compute-dtype", "float32"],
         "--quantize: bnb_4bit_compute_dtype float32 differs from the training dtype bfloat16"),
        (["--quantize", "4bit", "--check"], "--quantize: --check compares an unquantized step"),
    ],
)
def test_command_quantize_errors_are_one_line(config_path, argv, message, capsys):
    code = cli.main(["estimate", config_path, "--batch", "1", "--seq", "8", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("hf-ckpt estimate: error: ") and message in err and err.count("\n") == 1


def test_command_prints_the_quantized_base(config_path, capsys):
    code = cli.main(["estimate", config_path, "--batch", "1", "--seq", "8", "--lora-r", "4", "--quantize", "4bit",
                     "--quant-type", "fp4", "--strategies", "none"])
    assert code == 0
    assert "LORA on a 4bit fp4, compute bfloat16 base" in capsys.readouterr().out
