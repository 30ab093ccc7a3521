"""``attn_implementation`` / ``--attn``: eager attention is traced as written (it keeps the attention
probabilities), measured against a real CPU step; the choices and their limits are refused at the call."""

from __future__ import annotations

import re

import pytest
import torch
import transformers

from hf_ckpt import cli
from hf_ckpt.estimation import estimate
from hf_ckpt.meters.step import measure_step

pytestmark = pytest.mark.edge_releases  # the matrix's ends only (tests/release_guard.py)

BATCH, SEQ = 2, 64


def _config():
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                                    num_hidden_layers=4, vocab_size=256, max_position_embeddings=256)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_eager_attention_matches_a_real_eager_step():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(_config(), attn_implementation="eager").train()
    ids = torch.randint(3, 256, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    measured = measure_step(model, {"input_ids": ids, "labels": ids})
    eager = estimate(_config(), batch_size=BATCH, seq_len=SEQ, dtype="float32", device="cpu",
                     attn_implementation="eager", strategies=("none",))
    default = estimate(_config(), batch_size=BATCH, seq_len=SEQ, dtype="float32", device="cpu", strategies=("none",))
    assert eager.activation_bytes["none"] == pytest.approx(measured.retained_bytes, rel=0.03)
    # the probabilities (and the dropout's input): batch x heads x seq x seq float32 per block, at least
    assert eager.activation_bytes["none"] - default.activation_bytes["none"] >= 4 * BATCH * 4 * SEQ * SEQ * 4
    assert eager.attention["kernel"].startswith("eager")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attn_implementation": "flex"}, "attn_implementation must be one of eager, sdpa, flash (or None: the model's default); got 'flex'"),
        ({"attn_implementation": "flash", "device": "cpu"},
         "attn_implementation: flash (flash_attention_2) runs on CUDA only; use device='cuda'"),
    ],
)
def test_bad_attention_is_refused_at_the_call(kwargs, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        estimate(_config(), batch_size=1, seq_len=8, strategies=("none",), **kwargs)


def test_a_built_model_keeps_its_attention():
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(_config())
    message = ("attn_implementation: a model built on the meta device keeps its own attention; pass its config "
               "instead")
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        estimate(model, batch_size=1, seq_len=8, attn_implementation="eager", strategies=("none",))


def test_command_names_its_option(tmp_path, capsys):
    _config().save_pretrained(tmp_path)
    assert cli.main(["estimate", str(tmp_path), "--batch", "1", "--seq", "8", "--attn", "flex"]) == 2
    assert capsys.readouterr().err == ("hf-ckpt estimate: error: --attn must be one of eager, sdpa, flash (or "
                                       "None: the model's default); got 'flex'\n")
