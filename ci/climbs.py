"""Count the climbs back: calls from a lower layer of hf_ckpt into a higher one, followed through every entry point.

The layers are the import graph's: import-linter's layers contract in ``pyproject.toml`` (``[tool.importlinter]``,
checked by ``tests/test_layers.py``) ranks each package of hf_ckpt, the runtime lowest, the CLI highest; the package
``hf_ckpt`` itself (its ``__init__``) ranks with the public top level. A call from a function of a lower-ranked
package to a function of a higher-ranked one is a climb back: the layer below depends on the one above at run
time, whatever its imports say. The runtime's calls into what registered with it (the strategy kinds, the engines'
guard, the client unwrappers: :mod:`hf_ckpt.runtime.extensions`) are its extension points working as designed: they
are shown apart and not counted.

``sys.setprofile`` (and ``threading.setprofile``) sees every Python call; a call counts when its callee is a function
of hf_ckpt's own files and its caller, the nearest hf_ckpt function up the stack, ranks lower. A caller reached through
frames of torch or Python (a hook torch runs inside a runtime call, a package's ``__getattr__`` run by an import) is
marked: through an import (a package's lazy ``__getattr__``) it counts; through torch (a dispatch mode or hook
that a higher layer pushed around the runtime's call) it is torch's callback, shown apart and not counted. A package's lazy ``__getattr__`` (``hf_ckpt.runtime.util.lazy``) counts as that package's.
Every entry point is followed on a tiny ``LlamaForCausalLM``: ``enable`` with
each runtime setting (every second layer, selective, offload, a plan with partitions and outside blocks, the chunked
head) and a step and ``disable`` after each, a budget planned at the first batch, ``hf_ckpt.plan``, the mixin, the
patched ``gradient_checkpointing_enable``, ``hf_ckpt.distributed.apply``, and one step of the stock ``Trainer``.

Usage: ``python ci/climbs.py`` (from the repository root, hf_ckpt importable) prints, per phase, the hf_ckpt files
visited and each distinct climb ``caller module:function -> callee module:function`` with its number of calls.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
try:
    import tomllib
except ImportError:  # Python 3.10: import-linter depends on tomli there
    import tomli as tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

#: The package's folder.
PACKAGE = Path(__file__).resolve().parents[1] / "hf_ckpt"


def contract() -> dict[str, Any]:
    """The layers contract of ``pyproject.toml`` (import-linter's): the one place the layers are written."""
    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    (found,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return found


#: The contract's layers, lowest first; each a tuple of the top-level names (packages or modules) it holds.
LAYERS: tuple[tuple[str, ...], ...] = tuple(
    tuple(name.strip() for name in entry.split("|")) for entry in reversed(contract()["layers"]))
#: The runtime's own layers: what a training step may load (the runtime, and what registers with it).
RUNTIME_PACKAGES = ("runtime", "strategies", "distributed", "integrations")
#: The packages that register with the runtime: its calls into them are extension points, not climbs.
EXTENSIONS = ("strategies", "distributed", "integrations")
#: The public top level: the modules users call (and the package itself).
PUBLIC_MODULES = ("core", "mixin", "patch", "__main__")
#: The lab's packages: what decides or measures; read by ``tests/test_layers.py``.
LAB_PACKAGES = tuple(name for names in LAYERS for name in names
                     if name not in RUNTIME_PACKAGES and name not in PUBLIC_MODULES)


def rank(module: str) -> int:
    """The contract's rank of ``module`` (``hf_ckpt.x.y``): its top-level name's layer, 0 for the runtime; the package
    ``hf_ckpt`` itself ranks with the top."""
    parts = module.split(".")[1:]
    if not parts:
        return len(LAYERS) - 1
    return next(i for i, names in enumerate(LAYERS) if parts[0] in names)


def layer(module: str) -> str:
    """``"lab"``, ``"public"`` or ``"runtime"``: the group of the contract's layers ``module`` belongs to."""
    parts = module.split(".")[1:]
    if not parts or parts[0] in PUBLIC_MODULES:
        return "public"
    return "runtime" if parts[0] in RUNTIME_PACKAGES else "lab"


def _through_extension(caller: str, callee: str) -> bool:
    """A call from the runtime into a package that registered with it (a kind's check, the guard, an unwrapper)."""
    return caller.split(".")[1:2] == ["runtime"] and callee.split(".")[1:2][0] in EXTENSIONS


@dataclass
class Followed:
    """What one phase called: the hf_ckpt files visited, the climbs, ``(caller, callee) -> calls``, and the runtime's
    calls through its extension points (not climbs)."""

    files: set[str] = field(default_factory=set)
    climbs: Counter = field(default_factory=Counter)
    extensions: Counter = field(default_factory=Counter)
    callbacks: Counter = field(default_factory=Counter)


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
    return name, (rank(name) if parts[0] == "hf_ckpt" else _toy_rank(parts))


def _toy_rank(parts: tuple[str, ...]) -> int:
    """Another package's rank (the test's toy): ``runtime`` lowest, a top-level module highest."""
    return 0 if "runtime" in parts else 1


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
        caller_frame, foreign, imported = frame.f_back, 0, False
        while caller_frame is not None and module(caller_frame.f_code) is None:
            imported = imported or "importlib" in caller_frame.f_code.co_filename
            caller_frame, foreign = caller_frame.f_back, foreign + 1
        caller = module(caller_frame.f_code) if caller_frame is not None else None
        if caller is not None and _name(caller_frame.f_code).startswith("lazy_exports."):
            package = caller_frame.f_locals.get("package", caller[0])  # a package's own lazy __getattr__
            caller = (package, rank(package) if package.startswith("hf_ckpt") else caller[1])
        if caller is not None and caller[1] < callee[1]:
            via = " (via an import)" if imported else " (via torch or Python)" if foreign else ""
            key = (f"{caller[0]}:{_name(caller_frame.f_code)}", f"{callee[0]}:{_name(frame.f_code)}{via}")
            if _through_extension(caller[0], callee[0]):
                followed.extensions[key] += 1
            elif foreign and not imported:  # torch runs a hook or dispatch mode a higher layer put on
                followed.callbacks[key] += 1
            else:
                followed.climbs[key] += 1

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


def _tiny_llama(cls: Any = None) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    return (cls or LlamaForCausalLM)(config).train()


def _settings(folder: str) -> dict[str, dict[str, Any]]:
    """The runtime settings ``enable`` is followed with (a saved plan with partitions and outside blocks too)."""
    import hf_ckpt

    plan = hf_ckpt.CheckpointPlan(strategies=("full", "selective", "partition:0.5", "none"),
                                  outside_blocks=("model.norm",))
    path = str(Path(folder) / "plan.json")
    plan.save(path)
    from transformers import PreTrainedModel

    settings = {"every_n_layers": {"every_n_layers": 2}, "selective": {"strategy": "selective"},
                "offload": {"offload": True}, "plan": {"plan": path}, "head_chunk_size": {"head_chunk_size": 4}}
    if not isinstance(getattr(PreTrainedModel, "loss_function", None), property):  # the chunked head is refused
        del settings["head_chunk_size"]
    return settings


def _trainer_step(folder: str) -> None:
    """One step of the stock Trainer with the patch (its callback installed; the budget is followed above)."""
    import torch
    from transformers import Trainer, TrainingArguments

    import hf_ckpt

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = torch.randint(1, 64, (8,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids.clone()}

    args = TrainingArguments(output_dir=folder, gradient_checkpointing=True,
                             gradient_checkpointing_kwargs={"every_n_layers": 2}, max_steps=1,
                             per_device_train_batch_size=2, learning_rate=0.0, report_to=[], use_cpu=True,
                             save_strategy="no", logging_strategy="no", dataloader_num_workers=0)
    hf_ckpt.patch_transformers()
    try:
        Trainer(model=_tiny_llama(), args=args, train_dataset=Tokens()).train()
    finally:
        hf_ckpt.unpatch_transformers()


def measure() -> dict[str, Followed]:
    """Follow every entry point on a tiny Llama: each phase's :class:`Followed`."""
    import warnings

    import torch

    import hf_ckpt

    root = Path(hf_ckpt.__file__).resolve().parent
    ids = torch.randint(0, 64, (2, 8))
    batch = {"input_ids": ids, "labels": ids}
    phases: dict[str, Followed] = {}

    def step(model: Any) -> None:
        model(**batch).loss.backward()

    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as folder:
        warnings.simplefilter("ignore")
        for name, options in _settings(folder).items():
            model = _tiny_llama()
            phases[f"enable {name}"] = follow(lambda: hf_ckpt.enable(model, **options), root)
            phases[f"step {name}"] = follow(lambda: step(model), root)
            phases[f"disable {name}"] = follow(lambda: hf_ckpt.disable(model), root)
        model = _tiny_llama()
        phases["enable budget"] = follow(lambda: hf_ckpt.enable(model, budget=0.5), root)
        phases["step budget"] = follow(lambda: step(model), root)
        phases["plan"] = follow(lambda: hf_ckpt.plan(_tiny_llama(), batch, 0.5), root)
        mixin = type("CkptLlama", (hf_ckpt.GradientCheckpointingMixin, type(_tiny_llama())), {})
        model = _tiny_llama(mixin)
        phases["mixin"] = follow(lambda: (model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"every_n_layers": 2}), step(model)), root)
        model = _tiny_llama()

        def patched() -> None:
            hf_ckpt.patch_transformers()
            try:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"every_n_layers": 2})
                step(model)
            finally:
                hf_ckpt.unpatch_transformers()

        phases["patch"] = follow(patched, root)
        model = _tiny_llama()
        phases["distributed apply"] = follow(lambda: (hf_ckpt.distributed.apply(model, every_n_layers=2),
                                                      step(model), hf_ckpt.distributed.remove(model)), root)
        phases["trainer"] = follow(lambda: _trainer_step(folder), root)
    return phases


def report(phases: dict[str, Followed]) -> str:
    """Each phase's files visited and distinct climbs (with their calls), then the totals."""
    lines = []
    for phase, followed in phases.items():
        lines.append(f"{phase}: {len(followed.files)} hf_ckpt files visited, {len(followed.climbs)} distinct climbs "
                     f"({sum(followed.climbs.values())} calls)")
        lines += [f"  {caller} -> {callee}: {calls}" for (caller, callee), calls in sorted(followed.climbs.items())]
        lines += [f"  (extension point) {caller} -> {callee}: {calls}"
                  for (caller, callee), calls in sorted(followed.extensions.items())]
        lines.append(f"  and {len(followed.callbacks)} callbacks torch makes into hooks and dispatch modes a higher "
                     "layer installed (not counted)" if followed.callbacks else "")
    files = set().union(*(followed.files for followed in phases.values()))
    climbs = set().union(*(followed.climbs for followed in phases.values()))
    lines.append(f"total: {len(files)} hf_ckpt files visited, {len(climbs)} distinct climbs")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the measurement (see the module docstring); ``--help`` says what it does without measuring."""
    parser = argparse.ArgumentParser(prog="python ci/climbs.py", description=(__doc__ or "").split("\n\n")[0],
                                     epilog="Follows every entry point on a tiny Llama (about a minute on a CPU).")
    parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    print(report(measure()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
