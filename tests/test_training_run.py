"""A setting survives a real training run with the stock ``Trainer``: evaluation between steps, accelerate's mixed
precision trained twice, a loss computed outside the model.

Each training step is measured, not read from flags: the bytes autograd saved for backward, the blocks backward
reran (``BlockRunCounter``), whether the training forward returned logits, and the dtype a block's projection ran in.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import Trainer, TrainingArguments

import hf_ckpt
from hf_ckpt.runtime.counting import BlockRunCounter
from helpers import TokenRows, tiny_llama

VOCAB, SEQ = 64, 16
HAS_LOSS_FUNCTION = isinstance(getattr(__import__("transformers").PreTrainedModel, "loss_function", None), property)
needs_loss_function = pytest.mark.skipif(not HAS_LOSS_FUNCTION, reason="head_chunk_size needs "
                                         "PreTrainedModel.loss_function (transformers >= 4.46)")
#: (gradient_checkpointing_kwargs, the blocks backward reruns, whether a training forward returns logits)
SETTINGS = [
    pytest.param({"every_n_layers": 2}, [0, 2], True, id="every_n_layers"),
    pytest.param({"head_chunk_size": 8}, [0, 1, 2, 3], False, id="head_chunk_size", marks=needs_loss_function),
]


class _MeasuredTrainer(Trainer):
    """The stock Trainer, each training step measured: (saved bytes, blocks rerun, logits returned)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.measured: list[tuple[int, list[int], bool]] = []
        self.model.register_forward_hook(self._note_logits)  # the user's own hook, beside hf_ckpt's
        self._logits: list[bool] = []

    def _note_logits(self, module, args, output) -> None:
        if module.training and torch.is_grad_enabled():
            self._logits.append(output.get("logits") is not None)

    def training_step(self, model, inputs, *args, **kwargs):
        saved = [0]

        def pack(tensor):
            saved[0] += tensor.numel() * tensor.element_size()
            return tensor

        self._logits.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), BlockRunCounter(self.model) as runs:
            loss = super().training_step(model, inputs, *args, **kwargs)
        self.measured.append((saved[0], runs.recomputed(), all(self._logits)))
        return loss


def _args(tmp_path, kwargs: dict | None, **extra) -> TrainingArguments:
    options = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": kwargs} if kwargs is not None else {}
    return TrainingArguments(
        output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=2, learning_rate=0.0, report_to=[],
        use_cpu=True, save_strategy="no", logging_strategy="no", dataloader_num_workers=0, seed=0, **options, **extra)


def _train(tmp_path, kwargs: dict | None, **extra) -> _MeasuredTrainer:
    torch.manual_seed(0)
    trainer = _MeasuredTrainer(model=tiny_llama(), args=_args(tmp_path, kwargs, **extra),
                               train_dataset=TokenRows(VOCAB, SEQ), eval_dataset=TokenRows(VOCAB, SEQ))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        trainer.train()
    return trainer


@pytest.mark.parametrize("kwargs, recomputed, logits", SETTINGS)
def test_evaluation_between_steps_keeps_the_setting(patched, tmp_path, kwargs, recomputed, logits):
    """``eval_strategy="steps"`` runs the evaluation loop (no grad, eval mode) after every step: each step after it
    saves the same bytes, reruns the same blocks and returns (or not) logits as the first, and as a run without
    evaluation."""
    plain = _train(tmp_path, kwargs).measured
    evaluated = _train(tmp_path, kwargs, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=2)
    assert evaluated.state.global_step == 3
    assert evaluated.measured == plain == [plain[0]] * 3
    assert plain[0][1:] == (recomputed, logits)
    assert hf_ckpt.checkpointed_layers(evaluated.model) == recomputed
    unchecked = _train(tmp_path, None).measured
    assert plain[0][0] < unchecked[0][0]  # measured: checkpointing saves bytes in every step


@pytest.mark.parametrize("kwargs, recomputed, logits", SETTINGS)
def test_mixed_precision_trained_twice_stays_mixed(patched, tmp_path, kwargs, recomputed, logits):
    """accelerate wraps the model's ``forward`` for bf16 autocast; a second ``train()`` enables checkpointing again.
    Every step of both runs computes a block's projections in bfloat16, and keeps the setting."""
    torch.manual_seed(0)
    trainer = _MeasuredTrainer(model=tiny_llama(), args=_args(tmp_path, kwargs, bf16=True),
                               train_dataset=TokenRows(VOCAB, SEQ))
    dtypes: list[torch.dtype] = []
    trainer.model.model.layers[1].self_attn.q_proj.register_forward_hook(
        lambda module, args, output: dtypes.append(output.dtype) if module.training else None)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        trainer.train()
        first = len(dtypes)
        trainer.train()
    assert first > 0 and len(dtypes) > first
    assert set(dtypes) == {torch.bfloat16}
    assert [step[1:] for step in trainer.measured] == [(recomputed, logits)] * 6


@needs_loss_function
def test_label_smoothing_takes_the_labels_out_and_is_named(patched, tmp_path):
    """With ``label_smoothing_factor`` the Trainer computes the loss from the logits: the head runs whole, and one
    warning says so."""
    with pytest.warns(hf_ckpt.HfCkptWarning) as caught:
        trainer = _train(tmp_path, {"head_chunk_size": 8}, label_smoothing_factor=0.1)
    assert [str(w.message) for w in caught if w.category is hf_ckpt.HfCkptWarning] == [
        "head_chunk_size=8 does not take effect in a training forward without labels: LlamaForCausalLM computes the "
        "full logits, for a loss computed outside the model (the Trainer's label_smoothing_factor or "
        "compute_loss_func take the labels out). Give the model its labels, or drop head_chunk_size"]
    assert [step[2] for step in trainer.measured] == [True] * 3


def test_reading_the_setting_inside_a_no_grad_forward_keeps_it():
    """A hook that reads the setting in the middle of a forward under ``no_grad`` (a logging callback during
    ``generate``): the stacks' flags are off for that forward by hf_ckpt's own doing, so the record is current, the
    answer is the setting, no warning, and the next training step is checkpointed as before."""
    model = tiny_llama()
    hf_ckpt.enable(model, every_n_layers=2)
    ids = torch.randint(1, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()  # the first step measures the setting
    read: list[list[int]] = []
    model.model.layers[1].register_forward_pre_hook(lambda module, args: read.append(hf_ckpt.checkpointed_layers(model)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", hf_ckpt.HfCkptWarning)
        with torch.no_grad():
            model(input_ids=ids)
        model.generate(ids[:1, :4], max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert read == [[0, 2]] * len(read) and len(read) == 3
    with BlockRunCounter(model) as runs:
        model(input_ids=ids, labels=ids).loss.backward()
    assert runs.recomputed() == [0, 2] == hf_ckpt.checkpointed_layers(model)
