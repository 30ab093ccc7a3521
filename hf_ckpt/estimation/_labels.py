"""The batch a model's training head takes: token ids and labels of the head's own shape.

* causal, masked and seq2seq language models: ``labels`` the shape of the tokens;
* ``...ForSequenceClassification``: one label per sequence (an int class, a float for regression,
  ``num_labels`` floats for multi-label, as ``config.problem_type`` says);
* ``...ForTokenClassification``: a class per token;
* ``...ForQuestionAnswering``: ``start_positions`` and ``end_positions``, one per sequence.

Models that take no token ids (vision, audio), heads whose batch has another shape (multiple choice) and models
with no training head (a base model: its forward, nor any it inherits, takes the labels) are refused with the reason.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

_REFUSED_HEADS = ("ForMultipleChoice", "ForNextSentencePrediction", "ForPreTraining")


def check_text_model(model: nn.Module) -> None:
    """Raise ValueError, naming why, where the estimate cannot build ``model``'s batch."""
    name = type(model).__name__
    for suffix in _REFUSED_HEADS:
        if name.endswith(suffix):
            raise ValueError(f"model_or_config: {name}'s batch ({suffix[3:]}) is not modelled: the estimate builds "
                             "token ids with labels per token, per sequence (classification) or answer spans")
    parameters = inspect.signature(model.forward).parameters
    if "input_ids" not in parameters:
        first = next(iter(parameters), "?")
        raise ValueError(f"model_or_config: {name} takes {first}, not token ids: the estimate builds text batches "
                         "only (vision and audio models are not estimated)")
    main = getattr(model, "main_input_name", "input_ids")
    if main not in ("input_ids", "inputs", "inputs_embeds") and main in parameters:  # e.g. BLIP-2: pixels first
        raise ValueError(f"model_or_config: {name}'s main input is {main}, not token ids: the estimate builds text "
                         "batches only (vision and audio models are not estimated)")
    codebooks = getattr(getattr(model, "config", None), "num_codebooks", None)
    if isinstance(codebooks, int) and codebooks > 1:
        raise ValueError(f"model_or_config: {name} takes {codebooks} audio codebook ids per position "
                         "(config.num_codebooks): the estimate builds one token id per position, text batches only")
    label = next(key for key in batch_for(model, 1, 1) if key != "input_ids")  # the batch this head is given
    if not _takes(type(model), label):
        raise ValueError(f"model_or_config: {name} has no training head (its forward takes no {label}, so it "
                         "returns no loss): estimate a model with one, e.g. config.architectures naming its "
                         "...ForCausalLM")


def _takes(cls: type, parameter: str) -> bool:
    """Whether the ``forward`` of ``cls`` or of a class it inherits declares ``parameter`` (a head may pass it on
    through ``**kwargs`` to its parent's, as 5.x's generic classification heads do)."""
    for klass in cls.__mro__:
        forward = vars(klass).get("forward")
        if forward is None:
            continue
        try:
            if parameter in inspect.signature(forward).parameters:
                return True
        except (TypeError, ValueError):  # a builtin without a signature
            continue
    return False


def _label_count(config: Any) -> int:
    return max(int(getattr(config, "num_labels", 2) or 2), 1)


def batch_for(model: nn.Module, batch_size: int, seq_len: int) -> dict[str, torch.Tensor]:
    """Token ids (zeros) and the labels ``model``'s head takes (a PEFT model's: its base model's)."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    ids = torch.zeros((batch_size, seq_len), dtype=torch.long)
    if isinstance(vocab, int) and vocab > 0:
        ids = ids % vocab
    name = type(model).__name__
    if name.endswith("ForSequenceClassification"):
        count, problem = _label_count(config), getattr(config, "problem_type", None)
        if problem == "regression" or (problem is None and count == 1):
            labels = torch.zeros((batch_size,) if count == 1 else (batch_size, count))
        elif problem == "multi_label_classification":
            labels = torch.zeros((batch_size, count))
        else:
            labels = torch.zeros((batch_size,), dtype=torch.long)
        return {"input_ids": ids, "labels": labels}
    if name.endswith("ForTokenClassification"):
        return {"input_ids": ids, "labels": torch.zeros((batch_size, seq_len), dtype=torch.long)}
    if name.endswith("ForQuestionAnswering"):
        positions = torch.zeros((batch_size,), dtype=torch.long)
        return {"input_ids": ids, "start_positions": positions, "end_positions": positions.clone()}
    return {"input_ids": ids, "labels": ids}
