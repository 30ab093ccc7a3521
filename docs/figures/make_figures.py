"""Draw the figures of the documentation: ``python docs/figures/make_figures.py`` (needs matplotlib).

* ``saved_vs_recomputed.png`` (docs/concepts.md): for a stack of six blocks, what each block keeps from the
  forward to the backward pass without checkpointing, with every block checkpointed, and with
  ``every_n_layers=2``. A schematic: the heights are not measurements (``hf-ckpt bench`` measures them).

The PNGs are committed next to this script; rerun it after changing a figure.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import matplotlib
except ImportError:
    sys.exit("docs/figures/make_figures.py needs matplotlib: pip install 'hf_ckpt[bench]'")

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

HERE = Path(__file__).resolve().parent
BLOCKS = 6
INTERNAL = 4  # activation "units" a block saves for its backward without checkpointing (schematic)

SAVED = "#3b7dd8"
INPUT = "#f2a23a"
RECOMPUTED = "#d9e6f7"

ROWS = [
    ("no checkpointing", set()),
    ("every block checkpointed\n(every_n_layers=1)", set(range(BLOCKS))),
    ("every other block\n(every_n_layers=2)", set(range(0, BLOCKS, 2))),
]


def _draw_row(ax, y: float, label: str, checkpointed: set[int]) -> None:
    ax.text(-0.4, y + 1.0, label, ha="right", va="center", fontsize=10)
    for index in range(BLOCKS):
        x = index * 1.6
        ax.add_patch(Rectangle((x, y), 1.2, 0.5, facecolor="white", edgecolor="black", linewidth=1.0))
        ax.text(x + 0.6, y + 0.25, f"block {index}", ha="center", va="center", fontsize=8)
        top = y + 0.6
        if index in checkpointed:
            ax.add_patch(Rectangle((x + 0.1, top), 1.0, 0.3, facecolor=INPUT, edgecolor="black", linewidth=0.6))
            ax.add_patch(
                Rectangle(
                    (x + 0.1, top + 0.3), 1.0, 0.3 * INTERNAL, facecolor=RECOMPUTED, edgecolor="#7f9cc4",
                    linewidth=0.6, linestyle="--", hatch="///",
                )
            )
            ax.add_patch(
                FancyArrowPatch(
                    (x + 1.28, top + 0.15), (x + 1.28, top + 0.3 + 0.3 * INTERNAL), arrowstyle="->",
                    mutation_scale=8, color="#7f9cc4", connectionstyle="arc3,rad=-0.4",
                )
            )
        else:
            ax.add_patch(
                Rectangle((x + 0.1, top), 1.0, 0.3 * (INTERNAL + 1), facecolor=SAVED, edgecolor="black", linewidth=0.6)
            )
    recomputed = ", ".join(str(i) for i in sorted(checkpointed)) or "none"
    ax.text(BLOCKS * 1.6 - 0.2, y + 0.25, f"recomputed: {recomputed}", ha="left", va="center", fontsize=9)


def saved_vs_recomputed(path: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 6.2))
    spacing = 2.6
    for row, (label, checkpointed) in enumerate(ROWS):
        _draw_row(ax, (len(ROWS) - 1 - row) * spacing, label, checkpointed)
    ax.set_xlim(-4.2, BLOCKS * 1.6 + 2.2)
    ax.set_ylim(-0.9, len(ROWS) * spacing)
    ax.axis("off")
    ax.set_title("What each block keeps from forward to backward (schematic)", fontsize=12)
    ax.legend(
        handles=[
            Patch(facecolor=SAVED, edgecolor="black", label="activations saved in forward, held until backward"),
            Patch(facecolor=INPUT, edgecolor="black", label="block input, saved by the checkpoint"),
            Patch(
                facecolor=RECOMPUTED, edgecolor="#7f9cc4", hatch="///",
                label="activations recomputed in backward, held only while the block's backward runs",
            ),
        ],
        loc="lower center",
        bbox_to_anchor=(0.5, -0.08),
        ncol=1,
        fontsize=9,
        frameon=False,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    saved_vs_recomputed(HERE / "saved_vs_recomputed.png")


if __name__ == "__main__":
    main()
