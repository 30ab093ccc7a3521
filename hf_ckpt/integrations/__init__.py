"""Clients around transformers that wrap a model: recognised by class (module and name), never imported here.

* :mod:`.sentence_transformers`: a ``SentenceTransformer`` (and its ``Transformer`` module) holds the
  ``PreTrainedModel`` it encodes with.
* :mod:`.deepspeed`: a ``DeepSpeedEngine`` holds the model it trains as ``.module``; the DeepSpeed config's
  ``"activation_checkpointing"`` block.

:func:`unwrap` is what the core calls where it looks for the model to act on.
"""

from __future__ import annotations

from torch import nn

from hf_ckpt.runtime.compat import defined_in
from hf_ckpt.integrations import deepspeed, sentence_transformers


def unwrap(model: nn.Module) -> nn.Module | None:
    """The module a client wrapper holds (a ``DeepSpeedEngine``'s model, a ``SentenceTransformer``'s
    ``PreTrainedModel``), or None when ``model`` is no client wrapper."""
    for client in (deepspeed, sentence_transformers):
        inner = client.unwrap(model)
        if inner is not None:
            return inner
    return None


__all__ = ["defined_in", "unwrap"]
