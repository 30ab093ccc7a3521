"""The model to estimate: a config (object, ``config.json`` file or folder) or a model on the meta device.

Nothing here allocates a weight. The full-depth model is built on the ``meta`` device (parameter counts and the
list of blocks); a *reduced* copy keeps the first three and the last block of each distinct block type and is the one traced.
A block's type is its class, its parameter shapes and its ``attention_type`` (sliding or full attention): the
first T5 block (it owns the relative position bias) is a type of its own, Gemma-2's sliding and global layers
are two types. Each block of the full model is then represented by a traced block of its type: the first block
of a type by the first traced one, the last by the last, every block between by the second, so the effects of
a type's first block (a position bias computed once) and of the last (followed by the final norm) are kept and
the rest scale by the count.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hf_ckpt.runtime.target import target_model
from hf_ckpt.runtime.blocks import Block, find_blocks

#: Config attributes that hold a number of repeated blocks (per stack).
_LAYER_COUNTS = (
    "num_hidden_layers", "num_layers", "num_decoder_layers", "n_layer", "n_layers", "encoder_layers",
    "decoder_layers",
)
#: Auto mappings tried, in order, when the config names no architecture the installed transformers has.
_TASK_MAPPINGS = (
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES",
)
#: Per-layer lists in configs that must keep the length of the layer count.
_PER_LAYER_LISTS = ("layer_types",)


def load_config(source: Any) -> Any:
    """A ``PretrainedConfig`` from a config object, a ``config.json`` path or a folder holding one."""
    from transformers import AutoConfig

    path = os.fspath(source)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model_or_config: no config.json at {os.fspath(source)!r}")
    return AutoConfig.from_pretrained(path)


def model_class(config: Any) -> type:
    """The model class with a training head for ``config``: its ``architectures`` entry, else the first task
    (causal LM, seq2seq LM, masked LM, image-text-to-text) the installed transformers registers it for."""
    import transformers
    from transformers.models.auto import modeling_auto

    for name in getattr(config, "architectures", None) or ():
        found = getattr(transformers, name, None)
        if isinstance(found, type) and issubclass(found, nn.Module):
            return found
    for mapping in _TASK_MAPPINGS:
        name = dict(getattr(modeling_auto, mapping, {})).get(getattr(config, "model_type", None))
        found = getattr(transformers, name, None) if isinstance(name, str) else None
        if found is not None:
            return found
    raise ValueError(
        f"model_or_config: no model class for model_type {getattr(config, 'model_type', None)!r} in this "
        "transformers (neither config.architectures nor the causal-LM, seq2seq, masked-LM or image-text-to-text "
        "auto mappings name one); pass a model built on the meta device instead"
    )


def _sub_configs(config: Any) -> list[Any]:
    from transformers import PretrainedConfig

    return [value for value in vars(config).values() if isinstance(value, PretrainedConfig)]


def _kept_layers(count: int, layer_types: list | None) -> list[int]:
    """Indices of the layers kept in the reduced model: the first three of each layer type and the last one.

    Three and the last, because a block's retained bytes depend on its neighbours (a block's output is kept when
    the next block checkpoints it): the first block of a type, a middle one (with a block of its type on both
    sides) and the last one (followed by the final norm) each stand for themselves.
    """
    if layer_types is None or len(layer_types) != count:
        return list(range(count)) if count <= 4 else [0, 1, 2, count - 1]
    last = {kind: index for index, kind in enumerate(layer_types)}
    seen: dict[Any, int] = {}
    kept = []
    for index, kind in enumerate(layer_types):
        seen[kind] = seen.get(kind, 0) + 1
        if seen[kind] <= 3 or index == last[kind] or index == count - 1:
            kept.append(index)
    return kept


def _reduce_in_place(config: Any) -> None:
    attributes = vars(config)
    counts = {name: attributes[name] for name in _LAYER_COUNTS if isinstance(attributes.get(name), int)}
    for name, count in counts.items():
        if count <= 0:
            continue
        lists = {key: attributes[key] for key in _PER_LAYER_LISTS if isinstance(attributes.get(key), list)}
        kept = _kept_layers(count, lists.get("layer_types"))
        for key, values in lists.items():
            if len(values) == count:
                setattr(config, key, [values[i] for i in kept])
        setattr(config, name, len(kept))
    for sub in _sub_configs(config):
        _reduce_in_place(sub)


def reduced_config(config: Any) -> Any:
    """A copy of ``config`` with at most four blocks of each layer type per stack (sub-configs too)."""
    reduced = copy.deepcopy(config)
    _reduce_in_place(reduced)
    return reduced


def build_on_meta(model_type: type, config: Any, dtype: torch.dtype) -> nn.Module:
    """``model_type(config)`` on the meta device, in ``dtype``, in training mode: no memory is allocated."""
    with torch.device("meta"):
        if hasattr(model_type, "_from_config"):  # dtype is set below: its keyword differs across releases
            model = model_type._from_config(config)
        else:  # pragma: no cover - not a PreTrainedModel
            model = model_type(config)
        if hasattr(model, "tie_weights"):  # some releases leave tied embeddings untied on the meta device
            model.tie_weights()
    return model.to(dtype=dtype).train()


def block_key(block: Block) -> tuple:
    """What makes two blocks cost the same: class, parameter shapes and attention type."""
    shapes = tuple((name, tuple(p.shape)) for name, p in block.module.named_parameters())
    return (type(block.module).__qualname__, shapes, str(getattr(block.module, "attention_type", "")))


@dataclass(frozen=True)
class BlockMap:
    """How the full model's blocks are represented by the traced (reduced) model's blocks.

    Attributes:
        representative: ``representative[i]``: index of the traced block standing for full block ``i``.
        keys: The block type of each full block, as an index into the distinct types (for reports).
        traced_blocks: Number of blocks in the traced model.
    """

    representative: tuple[int, ...]
    keys: tuple[int, ...]
    traced_blocks: int

    def count(self, traced_index: int) -> int:
        """How many full blocks the traced block ``traced_index`` stands for."""
        return sum(1 for r in self.representative if r == traced_index)


def map_blocks(full: list[Block], traced: list[Block]) -> BlockMap:
    """Represent each full block by a traced block of the same type: the first of a type by the first traced one,
    the last by the last, the ones between by the second; raises ValueError when a type was not traced."""
    by_key: dict[tuple, list[int]] = {}
    for block in traced:
        by_key.setdefault(block_key(block), []).append(block.index)
    full_keys = [block_key(block) for block in full]
    totals = {key: full_keys.count(key) for key in full_keys}
    seen: dict[tuple, int] = {}
    order: dict[tuple, int] = {}
    representative, keys = [], []
    for block, key in zip(full, full_keys):
        candidates = by_key.get(key)
        if not candidates:
            raise ValueError(
                f"block {block.index} ({type(block.module).__name__}) has no block of the same type in the traced "
                "model: the reduced config lost a layer type this estimator does not know how to keep"
            )
        occurrence = seen.get(key, 0)
        seen[key] = occurrence + 1
        if occurrence == 0:
            chosen = candidates[0]
        elif occurrence == totals[key] - 1:
            chosen = candidates[-1]
        else:
            chosen = candidates[min(1, len(candidates) - 1)]
        representative.append(chosen)
        keys.append(order.setdefault(key, len(order)))
    return BlockMap(tuple(representative), tuple(keys), len(traced))


def blocks_of(model: nn.Module) -> list[Block]:
    return find_blocks(target_model(model))
