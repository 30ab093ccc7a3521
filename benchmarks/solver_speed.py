"""How long the one solver takes on menus whose bytes differ in every block (the worst case: twin blocks, as measured
or estimated, give tiny fronts): :func:`hf_ckpt.solver.knapsack.solve_menu`, median of N runs per menu shape.

    python benchmarks/solver_speed.py [--runs 3] [--budget 0.5]

Each menu: per block, ``none`` (10 MB plus up to 50 KB) and ``options - 1`` random options (bytes uniform below
``none``; cost about 1 to 3 per KB saved, plus noise; overhead 0 to 3), seeded, solved at ``budget`` times the bytes
of no checkpointing. Prints the shape and the median and range of the wall times.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from hf_ckpt.solver.knapsack import Option, solve_menu

SHAPES = ((32, 4), (32, 12), (80, 4), (32, 70))  # (blocks, options per block): a Llama-2-7B, op-level, a 70B


def _menu(blocks: int, options: int, rng: random.Random) -> list[list[Option]]:
    menu = []
    for _ in range(blocks):
        none = 10_000_000 + rng.randint(0, 50_000)
        row = [Option("none", none, 0)]
        for k in range(options - 1):
            kept = rng.randint(0, none)
            cost = (none - kept) // 1000 * rng.randint(1, 3) + rng.randint(0, 999)
            row.append(Option(f"o{k}", kept, cost, rng.randint(0, 3)))
        menu.append(row)
    return menu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per menu shape (default 3)")
    parser.add_argument("--budget", type=float, default=0.5, help="share of no checkpointing's bytes (default 0.5)")
    args = parser.parse_args()
    for blocks, options in SHAPES:
        menu = _menu(blocks, options, random.Random(0))
        budget = int(args.budget * sum(row[0].retained for row in menu))
        times = []
        for _ in range(args.runs):
            began = time.perf_counter()
            solve_menu(menu, 0, budget)
            times.append(time.perf_counter() - began)
        print(f"{blocks} blocks x {options} options: median {statistics.median(times):.2f} s "
              f"({min(times):.2f}-{max(times):.2f} s)")


if __name__ == "__main__":
    main()
