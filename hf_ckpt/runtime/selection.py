"""Which blocks to checkpoint: ``every_n_layers``, explicit ``layers``, or ``num_layers`` spread by a method.

Methods are registered by name, as in Megatron-LM's ``--recompute-method``:

* ``"uniform"``: ``num_layers`` blocks spread evenly over the model (block ``floor(i * N / k)`` for ``i < k``);
* ``"block"``: the first ``num_layers`` blocks.

Add a method with :func:`register_selection_method`; it receives the number of blocks and ``num_layers`` and
returns sorted block indices.
"""

from __future__ import annotations

from typing import Callable

SelectionMethod = Callable[[int, int], list[int]]

SELECTION_METHODS: dict[str, SelectionMethod] = {}


def register_selection_method(name: str) -> Callable[[SelectionMethod], SelectionMethod]:
    """Register ``function(num_blocks, num_layers) -> list[int]`` as the selection method ``name``."""

    def register(function: SelectionMethod) -> SelectionMethod:
        SELECTION_METHODS[name] = function
        return function

    return register


@register_selection_method("uniform")
def _uniform(num_blocks: int, num_layers: int) -> list[int]:
    return sorted({(i * num_blocks) // num_layers for i in range(num_layers)})


@register_selection_method("block")
def _first(num_blocks: int, num_layers: int) -> list[int]:
    return list(range(num_layers))


def every_nth(num_blocks: int, every_n_layers: int) -> list[int]:
    """Blocks ``0, n, 2n, ...``."""
    return list(range(0, num_blocks, every_n_layers))


def check_layers_in_range(layers: tuple[int, ...], num_blocks: int) -> None:
    outside = [i for i in layers if not 0 <= i < num_blocks]
    if outside:
        raise ValueError(
            f"layers must be block indices in 0..{num_blocks - 1} (this model has {num_blocks} repeated blocks, "
            f"counted encoder first); got {list(outside)} outside that range"
        )


def check_num_layers_in_range(num_layers: int, num_blocks: int) -> None:
    if num_layers > num_blocks:
        raise ValueError(
            f"num_layers must be between 1 and {num_blocks}, the number of repeated blocks of this model; "
            f"got {num_layers}"
        )
