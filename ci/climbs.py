"""Count the climbs back: calls from a lower layer of hf_ckpt into a higher one, followed while a model is used.

The layer of a module is read from its dotted path alone (:func:`layer`, the rule ``tests/test_layers.py`` checks
the imports with): the runtime (``hf_ckpt.runtime``, the strategies but their menus, ``distributed``,
``integrations``) ranks 0, the lab (``planning``, ``budget``, ``estimate``, ``measure``, ``verification``, ``cli``
and every strategy's ``menu``) 1, the public top level (``hf_ckpt.core``, ``hf_ckpt.mixin``, ...) 2. A call from a
function of a lower-ranked module to a function of a higher-ranked one is a climb back: the layer below depends on
the one above at run time, whatever its imports say.

``sys.setprofile`` (and ``threading.setprofile``) sees every Python call; a call counts when its callee is a function
of hf_ckpt's own files and its caller, the nearest hf_ckpt function up the stack, ranks lower. A caller reached through
frames of torch or Python (a hook torch runs inside a runtime call, a package's ``__getattr__`` run by an import) is
shown with the number of those frames. Three phases are followed on a tiny
``LlamaForCausalLM``: ``hf_ckpt.enable(model, every_n_layers=2)``, one forward and backward step, and
``hf_ckpt.disable(model)``.

Usage: ``python ci/climbs.py`` (from the repository root, hf_ckpt importable) prints, per phase, the hf_ckpt files
visited and each distinct climb ``caller module:function -> callee module:function`` with its number of calls.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

#: The lab's packages (a strategy kind's ``menu`` is the lab too); read by ``tests/test_layers.py``.
LAB_PACKAGES = ("planning", "budget", "estimate", "measure", "verification", "cli")
#: The rank of each layer: a call into a higher rank is a climb back.
RANK = {"runtime": 0, "lab": 1, "public": 2}


#: The package's folder: a top-level name that is a folder (``hf_ckpt.runtime``) is a package of its layer.
PACKAGE = Path(__file__).resolve().parents[1] / "hf_ckpt"


def layer(module: str) -> str:
    """``"lab"``, ``"public"`` or ``"runtime"``, read from the module's path (``hf_ckpt.x.y``) alone: the public layer
    is ``hf_ckpt`` and its top-level files; a top-level folder is the lab or the runtime, its ``__init__`` included."""
    parts = module.split(".")[1:]
    if (parts and parts[0] in LAB_PACKAGES) or "menu" in parts or parts == ["__main__"]:
        return "lab"
    return "public" if not parts or (len(parts) == 1 and not (PACKAGE / parts[0]).is_dir()) else "runtime"


@dataclass
class Followed:
    """What one phase called: the hf_ckpt files visited and the climbs, ``(caller, callee) -> calls``."""

    files: set[str] = field(default_factory=set)
    climbs: Counter = field(default_factory=Counter)


def _module_of(filename: str, root: Path) -> tuple[str, int] | None:
    """The dotted module of a file under ``root`` (the hf_ckpt package) and its layer's rank, or None for any other
    file (torch's, ``<string>``, ``<frozen importlib._bootstrap>``). A package's rank is its ``__init__``'s: the
    folder's layer (``hf_ckpt.runtime.__init__`` is the runtime, ``hf_ckpt.__init__`` the public top level)."""
    if not filename.endswith(".py"):
        return None
    try:
        parts = (root.name, *Path(filename).resolve().relative_to(root).with_suffix("").parts)
    except ValueError:
        return None
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return name, RANK[layer(".".join(parts))]


def follow(action: Callable[[], Any], root: Path) -> Followed:
    """Run ``action`` with a profiler that records hf_ckpt's files and its calls into a higher layer."""
    followed, modules = Followed(), {}

    def module(code: Any) -> tuple[str, int] | None:
        if code.co_filename not in modules:
            modules[code.co_filename] = _module_of(code.co_filename, root)
        return modules[code.co_filename]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = module(frame.f_code)
        if callee is None:
            return
        followed.files.add(frame.f_code.co_filename)
        caller_frame, foreign = frame.f_back, 0
        while caller_frame is not None and module(caller_frame.f_code) is None:
            caller_frame, foreign = caller_frame.f_back, foreign + 1
        caller = module(caller_frame.f_code) if caller_frame is not None else None
        if caller is not None and caller[1] < callee[1]:
            via = f" (via {foreign} frames of torch or Python)" if foreign else ""
            followed.climbs[(f"{caller[0]}:{_name(caller_frame.f_code)}", f"{callee[0]}:{_name(frame.f_code)}{via}")] += 1

    previous = sys.getprofile(), threading.getprofile()
    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(previous[0])
        threading.setprofile(previous[1])
    return followed


def _name(code: Any) -> str:
    return getattr(code, "co_qualname", code.co_name)


def measure() -> dict[str, Followed]:
    """Follow enable (every 2nd layer), one training step and disable on a tiny Llama: each phase's :class:`Followed`."""
    import warnings

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import hf_ckpt

    root = Path(hf_ckpt.__file__).resolve().parent
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).train()
    ids = torch.randint(0, 64, (2, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "enable": follow(lambda: hf_ckpt.enable(model, every_n_layers=2), root),
            "step": follow(lambda: model(input_ids=ids, labels=ids).loss.backward(), root),
            "disable": follow(lambda: hf_ckpt.disable(model), root),
        }


def report(phases: dict[str, Followed]) -> str:
    """Each phase's files visited and distinct climbs (with their calls), then the totals."""
    lines = []
    for phase, followed in phases.items():
        lines.append(f"{phase}: {len(followed.files)} hf_ckpt files visited, {len(followed.climbs)} distinct climbs "
                     f"({sum(followed.climbs.values())} calls)")
        lines += [f"  {caller} -> {callee}: {calls}" for (caller, callee), calls in sorted(followed.climbs.items())]
    files = set().union(*(followed.files for followed in phases.values()))
    climbs = set().union(*(followed.climbs for followed in phases.values()))
    lines.append(f"total: {len(files)} hf_ckpt files visited, {len(climbs)} distinct climbs")
    return "\n".join(lines)


def main() -> int:
    """Print the measurement (see the module docstring)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    print(report(measure()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
