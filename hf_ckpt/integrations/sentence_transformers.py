"""sentence-transformers: find the ``PreTrainedModel`` inside a ``SentenceTransformer`` (never imported here).

A ``SentenceTransformer`` (``CrossEncoder``, ``SparseEncoder``: every ``sentence_transformers`` ``BaseModel``) is
an ``nn.Sequential`` of modules, the first of which, a ``Transformer``, keeps the ``transformers`` model as
``.model`` (``.auto_model`` in every release). hf_ckpt acts on that model, so ``hf_ckpt.enable(st, ...)`` checkpoints
exactly the blocks ``hf_ckpt.enable(st[0].auto_model, ...)`` would.
"""

from __future__ import annotations

from torch import nn

from hf_ckpt.runtime.util.compat import defined_in

_PACKAGE = "sentence_transformers"


def _is_transformer_module(module: nn.Module) -> bool:
    return defined_in(module, _PACKAGE, "Transformer") and isinstance(getattr(module, "auto_model", None), nn.Module)


def is_sentence_transformers_model(model: object) -> bool:
    """A ``sentence_transformers`` model (``SentenceTransformer``, ``CrossEncoder``, ...) or its ``Transformer``."""
    return isinstance(model, nn.Module) and (
        defined_in(model, _PACKAGE, "BaseModel", "SentenceTransformer", "CrossEncoder", "SparseEncoder")
        or _is_transformer_module(model)
    )


def unwrap(model: nn.Module) -> nn.Module | None:
    """The ``transformers`` model inside a ``sentence_transformers`` model or ``Transformer`` module, else None.

    Raises:
        TypeError: the model holds no ``Transformer`` module, or several (a ``Router`` over several encoders):
            name the one to act on, e.g. ``hf_ckpt.enable(model[0], ...)``.
    """
    if not is_sentence_transformers_model(model):
        return None
    if _is_transformer_module(model):
        return model.auto_model
    backbones = [m for m in model.modules() if m is not model and _is_transformer_module(m)]
    if len(backbones) != 1:
        raise TypeError(
            f"hf_ckpt acts on the transformers model of a {type(model).__name__}, which holds "
            f"{len(backbones)} Transformer modules; pass the one to checkpoint (e.g. model[0])"
        )
    return backbones[0].auto_model
