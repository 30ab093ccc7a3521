"""DeepSpeed: the model inside a ``DeepSpeedEngine``, and the config's ``"activation_checkpointing"`` block.

Nothing here imports ``deepspeed``: the engine is recognised by its class, and the config is read from what is
already loaded (the engine, transformers' ``HfDeepSpeedConfig``, accelerate's DeepSpeed plugin).

The ``"activation_checkpointing"`` block of a DeepSpeed config (``partition_activations``,
``contiguous_memory_optimization``, ``cpu_checkpointing``, ...) configures ``deepspeed.checkpointing.checkpoint``
only, and only once ``deepspeed.checkpointing.configure`` has read it: neither the ``DeepSpeedEngine`` nor
transformers calls it, and transformers models checkpoint with ``torch.utils.checkpoint``. So the block has no effect
on a transformers model; :func:`warn_ignored_config` says so, once, naming the keys and what to set instead, when
hf_ckpt is asked to checkpoint. :func:`warn_unused_config` covers the other case: the block alone, transformers'
checkpointing off (a user expecting DeepSpeed to checkpoint, as Megatron-DeepSpeed does): then nothing is
checkpointed at all. hf_ckpt warns rather than turning checkpointing on: none of the block's keys selects blocks
or a strategy, so there is no setting it could be honoured as, and checkpointing changes the step's speed, which
the user did not ask hf_ckpt for. With :func:`hf_ckpt.patch_transformers` in force the ``Trainer`` calls it at
``on_train_begin`` (:class:`hf_ckpt.integrations.trainer.DeepSpeedConfigCallback`), after its DeepSpeed set-up
has read the config and after it has enabled checkpointing or not.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

from torch import nn

from hf_ckpt.runtime.util.compat import defined_in
from hf_ckpt.runtime.util.warn import warn_once

_PACKAGE = "deepspeed"
#: The keys of the ``"activation_checkpointing"`` block, and what to do instead of each in a transformers model.
_INSTEAD = {
    "partition_activations": "nothing: it splits the saved inputs across model-parallel (Megatron mpu) ranks, which "
    "a transformers model does not have",
    "contiguous_memory_optimization": "nothing: it only applies together with partition_activations",
    "cpu_checkpointing": "offload=True (keeps the saved inputs in pinned host memory on a machine with an "
    "accelerator; DeepSpeed's own cpu_checkpointing only acts together with partition_activations)",
    "number_checkpoints": "nothing: it sizes the contiguous buffer of contiguous_memory_optimization",
    "synchronize_checkpoint_boundary": "nothing: hf_ckpt adds no synchronisation",
    "profile": "hf_ckpt.measure (hf-ckpt bench) to time a step",
}


def is_engine(model: object) -> bool:
    """A ``deepspeed`` ``DeepSpeedEngine`` (or a subclass, e.g. the pipeline engine)."""
    return defined_in(model, _PACKAGE, "DeepSpeedEngine")


def unwrap(model: nn.Module) -> nn.Module | None:
    """The model a ``DeepSpeedEngine`` trains (its ``.module``), else None."""
    if is_engine(model) and isinstance(getattr(model, "module", None), nn.Module):
        return model.module
    return None


def _engine_config(model: Any) -> Mapping[str, Any] | None:
    config = getattr(model, "_config", None)
    params = getattr(config, "_param_dict", None)
    return params if isinstance(params, Mapping) else None


def _transformers_config() -> Mapping[str, Any] | None:
    module = sys.modules.get("transformers.integrations.deepspeed")
    getter = getattr(module, "deepspeed_config", None)
    config = getter() if getter is not None else None
    return config if isinstance(config, Mapping) else None


def _accelerate_config() -> Mapping[str, Any] | None:
    module = sys.modules.get("accelerate.state")
    shared = getattr(getattr(module, "AcceleratorState", None), "_shared_state", None)
    plugin = shared.get("deepspeed_plugin") if isinstance(shared, dict) else None
    config = getattr(plugin, "deepspeed_config", None)
    return config if isinstance(config, Mapping) else None


def active_config(model: Any = None) -> Mapping[str, Any] | None:
    """The DeepSpeed config in force: ``model``'s when it is an engine, else the one transformers' ``Trainer``
    (``TrainingArguments(deepspeed=...)``) or accelerate set up, else None."""
    if model is not None and is_engine(model):
        config = _engine_config(model)
        if config is not None:
            return config
    return _transformers_config() or _accelerate_config()


#: The values of DeepSpeed's ``"activation_checkpointing"`` keys that leave a key off.
_OFF = (None, False, 0, "none", "auto")


def ignored_keys(config: Mapping[str, Any] | None) -> list[str]:
    """The keys of ``config``'s ``"activation_checkpointing"`` block that are set (true or a number)."""
    block = (config or {}).get("activation_checkpointing")
    if not isinstance(block, Mapping):
        return []
    return [key for key, value in block.items() if value not in _OFF]


def _uses_configured_deepspeed_checkpoint(checkpoint_fn: Any) -> bool:
    """``checkpoint_fn`` is ``deepspeed.checkpointing.checkpoint`` and ``configure`` has read a config."""
    module = getattr(checkpoint_fn, "__module__", "") or ""
    if not module.startswith(_PACKAGE + "."):
        return False
    checkpointing = sys.modules.get("deepspeed.runtime.activation_checkpointing.checkpointing")
    is_configured = getattr(checkpointing, "is_configured", None)
    return bool(is_configured and is_configured())


def _advice(keys: list[str]) -> str:
    return "; ".join(f"{key}: {_INSTEAD.get(key, 'nothing (unknown to hf_ckpt)')}" for key in keys)


def warn_unused_config(config: Mapping[str, Any] | None, owner: Any = None) -> list[str]:
    """Warn once that ``config``'s ``"activation_checkpointing"`` block asks for checkpointing that never happens:
    call it where transformers' checkpointing is known to be off. Names the keys set, says how to checkpoint
    instead and what each key becomes. Returns the keys named (empty: no block, or nothing set in it).

    Args:
        config: A DeepSpeed config (a dict, as ``TrainingArguments.hf_deepspeed_config.config`` holds it), or None
            for the one in force (:func:`active_config`).
        owner: Warn once per this object (the model), else once per process.
    """
    keys = ignored_keys(config if config is not None else active_config())
    if not keys:
        return []
    warn_once(
        f'The DeepSpeed config\'s "activation_checkpointing" block sets {", ".join(keys)}, but activation '
        "checkpointing is off, so nothing is checkpointed: transformers models never call DeepSpeed's "
        "checkpointing, and the block does not turn it on. To checkpoint, set gradient_checkpointing=True in "
        "TrainingArguments (or call hf_ckpt.enable(model)); gradient_checkpointing_kwargs chooses how, e.g. "
        "{'every_n_layers': 2}, {'offload': True} or a memory budget {'budget': '40GiB'}. Otherwise remove the "
        f"block. Instead of each key: {_advice(keys)}.",
        key="deepspeed-activation-checkpointing-off:" + ",".join(keys),
        owner=owner,
    )
    return keys


def warn_ignored_config(model: Any, checkpoint_fn: Any = None, owner: Any = None) -> list[str]:
    """Warn once when a DeepSpeed config in force has an ``"activation_checkpointing"`` block: name its keys,
    say they have no effect on the transformers model and what to set instead. Returns the keys named.

    Silent when ``checkpoint_fn`` is ``deepspeed.checkpointing.checkpoint`` after ``deepspeed.checkpointing.configure``
    (the block's options then apply, as far as DeepSpeed honours them without model parallelism). ``owner``: warn
    once per this object (the model), else once per process.
    """
    keys = ignored_keys(active_config(model))
    if not keys or _uses_configured_deepspeed_checkpoint(checkpoint_fn):
        return []
    advice = _advice(keys)
    warn_once(
        f'The DeepSpeed config\'s "activation_checkpointing" block sets {", ".join(keys)}, which have no effect: '
        "neither transformers nor the DeepSpeed engine applies that block to a transformers model, whose blocks "
        "hf_ckpt checkpoints with torch.utils.checkpoint (which blocks: gradient_checkpointing=True and "
        f"gradient_checkpointing_kwargs, e.g. {{'every_n_layers': 2}}). Instead of each key: {advice}. To use "
        "DeepSpeed's own checkpoint function, call deepspeed.checkpointing.configure(None, deepspeed_config=...) "
        "and pass checkpoint_fn=deepspeed.checkpointing.checkpoint.",
        key="deepspeed-activation-checkpointing:" + ",".join(keys),
        owner=owner,
        stacklevel=5,
    )
    return keys
