"""Clients around transformers that wrap a model, recognised by class (module and name), never imported here:
:mod:`.sentence_transformers` (a ``SentenceTransformer`` holds the ``PreTrainedModel`` it encodes with) and
:mod:`.deepspeed` (a ``DeepSpeedEngine`` holds its model as ``.module``; the config's ``"activation_checkpointing"``
block). Imported with ``hf_ckpt``, the package registers its unwrapper and DeepSpeed's config check with the runtime
(:mod:`hf_ckpt.runtime.extensions`), loading the clients' modules at their first call."""

from __future__ import annotations

from typing import Any

from hf_ckpt.runtime import extensions


@extensions.register_unwrapper
def unwrap(model: Any) -> Any:
    """The module a client wrapper holds, or None when ``model`` is no client wrapper."""
    from hf_ckpt.integrations import deepspeed, sentence_transformers  # deferred: registering must not load torch
    for client in (deepspeed, sentence_transformers):
        inner = client.unwrap(model)
        if inner is not None:
            return inner
    return None


@extensions.register_config_check
def _check_config(model: Any, config: Any, owner: Any) -> None:
    from hf_ckpt.integrations import deepspeed
    deepspeed.warn_ignored_config(model, config.checkpoint_fn, owner=owner)
