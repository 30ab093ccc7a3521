"""Which modules are blocks: the units ``every_n_layers`` counts and checkpointing recomputes.

A stack-flag model's blocks are the elements of the stack's block list; a layer-flag model's blocks flag
themselves (``GradientCheckpointingLayer``). Where a stack holds both, only the layer-flag blocks can ever be
recomputed, so only they are blocks: anything else would be counted by ``every_n_layers`` and reported by
``checkpointed_layers`` without ever being checkpointed.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hf_ckpt.runtime.util.compat import gradient_checkpointing_layer_class
from hf_ckpt.runtime.blocks import find_blocks

LAYER = gradient_checkpointing_layer_class()
needs_layer_flags = pytest.mark.skipif(LAYER is None, reason="this transformers release has no GradientCheckpointingLayer")


class _Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def _layer() -> nn.Module:
    class Layer(LAYER):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

    return Layer()


class _StackFlag(nn.Module):
    """An old-style stack: the flag on the stack, the blocks its largest direct list."""

    def __init__(self) -> None:
        super().__init__()
        self.gradient_checkpointing = False
        self.layers = nn.ModuleList(_Plain() for _ in range(3))
        self.norms = nn.ModuleList(_Plain() for _ in range(2))


def test_a_stack_flag_models_blocks_are_its_largest_list():
    assert [b.name for b in find_blocks(_StackFlag())] == ["layers.0", "layers.1", "layers.2"]


def test_of_lists_as_long_as_each_other_the_blocks_are_the_heavier():
    """CLVP's conditioning encoder: a GroupNorm per block, listed before the attention blocks it precedes."""

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gradient_checkpointing = False
            self.group_norms = nn.ModuleList(nn.GroupNorm(2, 4) for _ in range(3))
            self.blocks = nn.ModuleList(_Plain() for _ in range(3))

    assert [b.name for b in find_blocks(Stack())] == ["blocks.0", "blocks.1", "blocks.2"]


def test_a_list_padded_with_none_is_read_past_the_none():
    """Informer (4.x): its encoder keeps a distilling conv per layer but the last, padding that list with None."""

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gradient_checkpointing = False
            self.layers = nn.ModuleList(_Plain() for _ in range(3))
            self.conv_layers = nn.ModuleList([nn.Conv1d(4, 4, 1), nn.Conv1d(4, 4, 1), None])

    assert [b.name for b in find_blocks(Stack())] == ["layers.0", "layers.1", "layers.2"]


@needs_layer_flags
def test_a_list_beside_layer_flag_blocks_is_no_block_list():
    """MusicGen: a per-codebook embedding list (larger than the layer list) beside the decoder layers."""

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gradient_checkpointing = False
            self.embed_tokens = nn.ModuleList(nn.Embedding(8, 4) for _ in range(4))
            self.layers = nn.ModuleList(_layer() for _ in range(2))

    assert [b.name for b in find_blocks(Stack())] == ["layers.0", "layers.1"]


@needs_layer_flags
def test_a_stage_holding_layer_flag_blocks_gives_way_to_them():
    """GroupViT: the stack iterates over stages, each stage holds the layer-flag blocks."""

    class Stage(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(_layer() for _ in range(2))
            self.downsample = _Plain()

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gradient_checkpointing = False
            self.stages = nn.ModuleList(Stage() for _ in range(2))

    names = [b.name for b in find_blocks(Stack())]
    assert names == ["stages.0.layers.0", "stages.0.layers.1", "stages.1.layers.0", "stages.1.layers.1"]
