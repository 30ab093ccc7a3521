"""Redraw the plot of a recorded ``hf-ckpt bench --json`` run: ``python docs/figures/replot_bench.py RUN.json OUT.png``.

The figures of the docs come from the runs they describe; this redraws one from its JSON (same measurements) after
a change to the plot itself, without measuring again. Needs matplotlib.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

try:
    import matplotlib  # noqa: F401
except ImportError:
    sys.exit("docs/figures/replot_bench.py needs matplotlib: pip install 'hf_ckpt[bench]'")

from hf_ckpt.measure.report import plot_tradeoff


def main(source: str, target: str) -> None:
    with open(source) as handle:
        data = json.load(handle)
    rows = data["settings"] if "settings" in data else data["strategies"]  # JSON written before the rename to settings
    results = [
        SimpleNamespace(
            setting=row["setting"] if "setting" in row else row["strategy"],
            step_time_s=row["step_time_s"],
            measurement=SimpleNamespace(retained_bytes=row["retained_bytes"]),
        )
        for row in rows
    ]
    plot_tradeoff(SimpleNamespace(results=results, clock=data["clock"], info=data["info"]), target)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.splitlines()[0])
    main(sys.argv[1], sys.argv[2])
