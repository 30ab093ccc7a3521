"""Every head gets labels of its own shape: sequence and token classification, question answering (and the
language models' token labels); models the estimate cannot build a batch for are refused in one line naming why.
Measured against real CPU steps of tiny BERT and Llama models."""

from __future__ import annotations

import re

import pytest
import torch
import transformers

from hf_ckpt import cli
from hf_ckpt.estimation import estimate
from hf_ckpt.estimation._labels import batch_for
from hf_ckpt.meters.step import measure_step

pytestmark = pytest.mark.edge_releases  # the matrix's ends only (tests/release_guard.py)

BATCH, SEQ = 4, 64
_BERT = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=4, vocab_size=256,
             max_position_embeddings=256)


def _bert(cls, **options):
    return transformers.BertConfig(**_BERT, architectures=[cls.__name__], **options), cls


def _llama_classifier():
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=4, vocab_size=256, pad_token_id=0,
                                      architectures=["LlamaForSequenceClassification"])
    return config, transformers.LlamaForSequenceClassification


HEADS = {
    "bert-sequence": lambda: _bert(transformers.BertForSequenceClassification),
    "bert-multi-label": lambda: _bert(transformers.BertForSequenceClassification, num_labels=3,
                                      problem_type="multi_label_classification"),
    "bert-regression": lambda: _bert(transformers.BertForSequenceClassification, num_labels=1),
    "bert-token": lambda: _bert(transformers.BertForTokenClassification, num_labels=5),
    "bert-qa": lambda: _bert(transformers.BertForQuestionAnswering),
    "llama-sequence": _llama_classifier,
}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", HEADS)
def test_head_estimate_matches_a_real_step(name):
    config, cls = HEADS[name]()
    torch.manual_seed(0)
    model = cls(config).train()
    batch = {**batch_for(model, BATCH, SEQ), "input_ids": torch.randint(3, 256, (BATCH, SEQ))}
    measured = measure_step(model, batch)
    made = estimate(config, batch_size=BATCH, seq_len=SEQ, dtype="float32", device="cpu", strategies=("none",))
    assert made.model_class == cls.__name__
    assert made.activation_bytes["none"] == pytest.approx(measured.retained_bytes, rel=0.03)
    # the step's timeline: the backward as the gradients appear, above the parameters and the states (a measured
    # step has no optimizer)
    assert made.peak_phase["none"] != "the optimizer step"
    backward = made.peak_bytes["none"] - made.parameters_bytes - made.optimizer_bytes
    assert backward == pytest.approx(measured.peak_bytes, rel=0.03)


def test_a_sequence_classifier_at_batch_4_seq_512_is_estimated():
    """The issue's crash: token labels handed to a sequence-level head."""
    config, _ = _bert(transformers.BertForSequenceClassification)
    config.max_position_embeddings = 512
    made = estimate(config, batch_size=4, seq_len=512, strategies=("none", "full"))
    assert made.model_class == "BertForSequenceClassification" and set(made.activation_bytes) == {"none", "full"}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (transformers.ViTConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=2,
                                architectures=["ViTForImageClassification"]),
         "model_or_config: ViTForImageClassification takes pixel_values, not token ids: the estimate builds text "
         "batches only (vision and audio models are not estimated)"),
        (transformers.BertConfig(**_BERT, architectures=["BertForMultipleChoice"]),
         "model_or_config: BertForMultipleChoice's batch (MultipleChoice) is not modelled: the estimate builds token "
         "ids with labels per token, per sequence (classification) or answer spans"),
    ],
)
def test_models_without_a_text_batch_are_refused_in_one_line(config, message, tmp_path, capsys):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        estimate(config, batch_size=1, seq_len=8, strategies=("none",))
    config.save_pretrained(tmp_path)
    assert cli.main(["estimate", str(tmp_path), "--batch", "1", "--seq", "8"]) == 2
    err = capsys.readouterr().err
    assert err == f"hf-ckpt estimate: error: {message}\n"
