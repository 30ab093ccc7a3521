"""The package's layering: its packages form the layers import-linter's contract names (``pyproject.toml``,
``[tool.importlinter]``), no module import cycle, few imports inside functions, each with its reason, a training
step loads no lab module, and no module reaches into another's private names.

Both checks read imports inside functions too: an import deferred into a function is an edge like any other
(deferring hides a cycle, it does not remove it).
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import re
import json
import sys
from pathlib import Path

import pytest
from fresh import run_fresh
from importlinter import cli as importlinter_cli

pytestmark = pytest.mark.edge_releases  # the matrix's ends only (tests/release_guard.py)

PACKAGE = Path(__file__).resolve().parents[1] / "hf_ckpt"


def _load_climbs():
    """``ci/climbs.py``, which holds the layer rule (:func:`_layer`) and measures the calls into a higher layer."""
    spec = importlib.util.spec_from_file_location("hf_ckpt_ci_climbs", PACKAGE.parent / "ci" / "climbs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_CLIMBS = _load_climbs()

#: Every import of a package module made inside a function, (importer, imported): why it waits for the call.
#: The registrations made when ``hf_ckpt`` is imported load no torch: each loads its runtime at its first call.
DEFERRED = {
    ("hf_ckpt.core", "hf_ckpt.budget.deferred"): "the lab (planner, estimator) loads only when a budget is asked for",
    ("hf_ckpt.runtime.apply", "hf_ckpt.runtime.stacks.direct"): "wrapping directly called blocks loads only for models with a stack flag",
    ("hf_ckpt.runtime.apply", "hf_ckpt.runtime.head"): "the chunked head (and its source check) loads only when head_chunk_size is set",
    ("hf_ckpt.runtime.apply", "hf_ckpt.runtime.mlp_chunks"): "the chunked MLP (and its position-wise check) loads only when mlp_chunk_size is set",
    ("hf_ckpt.patch", "hf_ckpt.integrations.trainer"): "transformers' Trainer is imported only when patching",
    ("hf_ckpt.distributed", "hf_ckpt.distributed.checks"): "the registered guard loads the engines' checks at its first call",
    ("hf_ckpt.distributed", "hf_ckpt.distributed._engines"): "the registered wrapped-blocks reader loads at its first call",
    ("hf_ckpt.integrations", "hf_ckpt.integrations.deepspeed"): "the registered unwrapper and config check load the client at their first call",
    ("hf_ckpt.integrations", "hf_ckpt.integrations.sentence_transformers"): "the registered unwrapper loads the client at its first call",
    ("hf_ckpt.strategies.outside", "hf_ckpt.strategies.outside.hook"): "the saved-tensor hook loads only for plans that use it",
    ("hf_ckpt.strategies.selective", "hf_ckpt.strategies.selective.spec"): "a kind registers without torch; its module loads when a setting uses it",
    ("hf_ckpt.strategies.oplevel", "hf_ckpt.strategies.oplevel.spec"): "a kind registers without torch; its module loads when a plan uses it",
    ("hf_ckpt.strategies.partition", "hf_ckpt.strategies.partition.spec"): "a kind registers without torch; its module loads when a plan uses it",
}
#: At most this many imports inside functions. The CLI has none: a command's module imports the lab's packages at
#: its top, which load a module only when the command first uses it (PEP 562), so ``--help`` loads no torch.
DEFERRED_BOUND = 13
#: The lab's packages: what decides or measures (the meters, the solver, the planners, budgets, the estimator, the
#: bench, verify, the CLI). A training step with a runtime setting loads none of them.
LAB_PACKAGES = _CLIMBS.LAB_PACKAGES
#: The public layer: the package's top level (enable/disable, the mixin, the patch). At most 12 modules live there.
TOP_LEVEL_MODULES = 12
#: The most lines of hf_ckpt source a training step with a runtime setting may load (4,500 before #38: the patched
#: step then loaded 4,496; after it 4,624: private torch attributes behind runtime/_torch.py, the kinds' answers
#: in the registry and the one EnableRequest add about 330 lines, distributed.apply's wrapper no longer loads; 4,648
#: before #46, 4,862 after it: the runtime's extension points (runtime/extensions.py), the registrations every
#: import of hf_ckpt makes (each kind's folder, distributed, integrations: no torch, the kinds' modules still load
#: only when a setting uses them) and the one door (EnableRequest.of, apply_request) add about 215 lines, so that the
#: runtime imports no package above it); #44 (the chunked head in hooks, the stale record's
#: warning, the stale check, runtime/stacks/wrapping.py: about 110) and #47 (mlp_chunk_size through core, config, apply, the
#: mixin: 36): 5,014 with the chunked head; #47's offload measured (its host copies counted apart on a CPU: about
#: 12 in runtime/offload.py): 5,026; a hook removed within a forward doing nothing (runtime/state.py) and the fake
#: tensor errors the estimator refuses with (runtime/_torch.py): 5,050, the bound itself.
RUNTIME_LINES = 5050


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(name: str, path: Path, modules: dict[str, Path]):
    """(imported module, imported name or None, lazy?) for every import of a hf_ckpt module in ``path``."""
    tree = ast.parse(path.read_text())
    lazy_nodes = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for inner in ast.walk(node)
    }
    type_checking = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        lazy = id(node) in lazy_nodes
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("hf_ckpt"):
                    yield alias.name, None, lazy
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(name, path.name == "__init__.py", node)
            if not source.startswith("hf_ckpt"):
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules:
                    yield submodule, None, lazy
                else:
                    yield source, alias.name, lazy


def _graph():
    modules = _modules()
    edges: dict[str, set[str]] = {name: set() for name in modules}
    private: list[str] = []
    for name, path in modules.items():
        for target, imported_name, lazy in _imports(name, path, modules):
            if target not in modules:
                continue
            packages = [".".join(target.split(".")[:i]) for i in range(2, target.count(".") + 1)]
            for module in [target, *packages]:
                if module != name and not name.startswith(module + "."):
                    edges[name].add(module)
            if imported_name and imported_name.startswith("_") and not imported_name.startswith("__"):
                private.append(f"{name} imports {imported_name} from {target}")
    return edges, private


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "active"
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "active":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return found


@pytest.mark.any_release
def test_the_package_has_no_import_cycle():
    edges, _ = _graph()
    assert _cycles(edges) == []


def _deferred_imports() -> set[tuple[str, str]]:
    modules = _modules()
    return {(name, target) for name, path in modules.items()
            for target, _, lazy in _imports(name, path, modules) if lazy and target in modules}


@pytest.mark.any_release
def test_every_import_inside_a_function_is_listed_with_its_reason():
    assert _deferred_imports() == set(DEFERRED)
    assert len(DEFERRED) <= DEFERRED_BOUND and all(reason for reason in DEFERRED.values())


def _layer(module: str) -> str:
    """``"lab"``, ``"public"`` or ``"runtime"``, read from the module's dotted path alone (``ci/climbs.py``'s rule)."""
    return _CLIMBS.layer(module)


def _lab(module: str) -> bool:
    return _layer(module) == "lab"


@pytest.mark.any_release
def test_the_path_says_the_layer():
    assert [_layer(m) for m in ("hf_ckpt.core", "hf_ckpt.runtime.apply", "hf_ckpt.strategies.partition.graph",
                                "hf_ckpt.planning.menus.partition", "hf_ckpt.meters.step",
                                "hf_ckpt.solver.knapsack", "hf_ckpt.cli.plan", "hf_ckpt.distributed.wrapper")] == [
        "public", "runtime", "runtime", "lab", "lab", "lab", "lab", "runtime"]


@pytest.mark.any_release
def test_the_top_level_holds_few_modules_and_every_package_says_what_it_owns():
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= TOP_LEVEL_MODULES, top
    packages = [path.parent for path in PACKAGE.rglob("__init__.py")]
    undocumented = [str(p.relative_to(PACKAGE.parent)) for p in packages
                    if not ast.get_docstring(ast.parse((p / "__init__.py").read_text()))]
    assert undocumented == []


def _lint(config: Path) -> int:
    """import-linter's exit code for the contracts in ``config`` (0: every contract kept). Its CLI configures logging
    with ``disable_existing_loggers``: the loggers it disables (``hf_ckpt``'s included) are enabled again after."""
    loggers = [logger for logger in logging.root.manager.loggerDict.values()
               if isinstance(logger, logging.Logger) and not logger.disabled]
    try:
        return importlinter_cli.lint_imports(config_filename=str(config), no_cache=True)
    finally:
        for logger in loggers:
            logger.disabled = False


@pytest.mark.any_release
def test_the_packages_form_the_layers_the_contract_names():
    """``pyproject.toml``'s layers contract, imports inside functions and under ``TYPE_CHECKING`` counted: every
    package of hf_ckpt is named (``exhaustive``), the runtime is at the bottom, the CLI on top, no exception."""
    config = PACKAGE.parent / "pyproject.toml"
    contract = _CLIMBS.contract()
    assert contract["type"] == "layers" and contract["exhaustive"] and contract["containers"] == ["hf_ckpt"]
    assert not ({"ignore_imports", "unmatched_ignore_imports_alerting"} & set(contract))
    assert _CLIMBS.LAYERS[0] == ("runtime",) and _CLIMBS.LAYERS[-1] == ("__main__",)
    assert _lint(config) == 0


@pytest.mark.any_release
def test_the_contract_check_sees_an_import_inside_a_function_that_climbs(tmp_path, monkeypatch):
    package = tmp_path / "toy"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "high.py").write_text("X = 1\n")
    (package / "low" / "__init__.py").write_text("")
    (package / "low" / "mod.py").write_text("def f():\n    from toy import high\n    return high.X\n")
    config = tmp_path / "contract.ini"
    config.write_text("[importlinter]\nroot_package = toy\n\n[importlinter:contract:1]\nname = toy\n"
                      "type = layers\ncontainers = toy\nlayers =\n    high\n    low\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _lint(config) == 1


@pytest.mark.any_release
def test_the_architecture_page_draws_the_contracts_layers_and_states_the_line_bound():
    """docs/architecture.md's tree lists the packages top to bottom as the contract does, and its figure of lines a
    training step may load is this test's."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    tree = page[page.index("```text\nhf_ckpt/\n") + len("```text\nhf_ckpt/\n"):]
    tree = tree[:tree.index("```")]
    drawn = [line.split()[0].rstrip("/").removesuffix(".py") for line in tree.splitlines()
             if line.startswith("  ") and not line.startswith("   ") and line.split()[1] in ("PUBLIC", "LAB", "RUNTIME")]
    assert drawn == [name for names in reversed(_CLIMBS.LAYERS) for name in names]
    assert f"at most {RUNTIME_LINES:,} lines of hf_ckpt" in page.replace("\n", " ")


#: A module of hf_ckpt as docs/architecture.md writes it: a path (``runtime/state.py``, ``planning/menus/``) or a
#: dotted name (``runtime.state.suspended``, ``hf_ckpt.solver.verified``), from a package's name on.
_NAMED_MODULE = re.compile(r"`(?:hf_ckpt[./])?((?:%s)(?:[./]\w+)*)" % "|".join(
    sorted({name for names in _CLIMBS.LAYERS for name in names} - {"core", "mixin", "patch", "__main__"})))


def _names_a_module(written: str) -> bool:
    """Whether ``written`` (``runtime/util/lazy.py``, ``runtime.apply.apply_request``) names a module or package of
    hf_ckpt, or a name one of them defines."""
    parts = written.removesuffix(".py").replace("/", ".").split(".")
    for k in range(len(parts), 0, -1):
        folder = PACKAGE.joinpath(*parts[:k])
        path = folder / "__init__.py" if (folder / "__init__.py").exists() else folder.with_suffix(".py")
        if path.exists():
            return k == len(parts) or re.search(rf"\b{parts[k]}\b", path.read_text()) is not None
    return False


@pytest.mark.any_release
def test_the_architecture_page_names_only_modules_that_exist():
    """Every module, package or name of hf_ckpt that docs/architecture.md writes (``runtime/state.py``,
    ``solver/verified.verified_plan``) exists: the page cannot go on naming modules a change removed."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    written = sorted(set(_NAMED_MODULE.findall(page)))
    assert len(written) > 20
    assert [name for name in written if not _names_a_module(name)] == []


@pytest.mark.any_release
def test_every_caller_goes_through_the_parsed_request():
    """One door in: a config is made from the user's (or the lab's) arguments only by ``EnableRequest``
    (``runtime/request.py``); every other module hands a parsed request on (``runtime.apply.apply_request``)."""
    making = [str(path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*.py"))
              if path.relative_to(PACKAGE).as_posix() not in ("runtime/request.py", "runtime/config.py")
              and any(isinstance(node, ast.Attribute) and node.attr == "from_arguments"
                      for node in ast.walk(ast.parse(path.read_text())))]
    assert making == []


_STEP = """
import json, sys, warnings
import torch
from transformers import LlamaConfig, LlamaForCausalLM
import hf_ckpt
setting = sys.argv[1]
config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=4, num_attention_heads=2,
                     num_key_value_heads=1)
model = LlamaForCausalLM(config).train()
warnings.simplefilter("ignore")
if setting == "every_n_layers":
    hf_ckpt.enable(model, every_n_layers=2)
elif setting == "selective":
    hf_ckpt.enable(model, strategy="selective")
elif setting == "offload":
    hf_ckpt.enable(model, offload=True)
elif setting == "plan":
    hf_ckpt.CheckpointPlan(strategies=("full", "selective", "none", "full")).save(sys.argv[2])
    hf_ckpt.enable(model, plan=sys.argv[2])
elif setting == "head_chunk_size":
    hf_ckpt.enable(model, head_chunk_size=4)
elif setting == "mlp_chunk_size":
    hf_ckpt.enable(model, mlp_chunk_size=4)
elif setting == "patched":
    hf_ckpt.patch_transformers()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"every_n_layers": 2})
ids = torch.randint(0, 64, (2, 8))
model(input_ids=ids, labels=ids).loss.backward()
assert hf_ckpt.checkpointed_layers(model), "nothing was recomputed"
loaded = {name: getattr(module, "__file__", None) for name, module in sys.modules.items() if name.startswith("hf_ckpt")}
print(json.dumps(loaded))
"""


def _has_loss_function() -> bool:
    """Whether the release's causal LMs compute their loss with ``self.loss_function`` (not 4.45): the chunked head
    is refused without it."""
    from transformers import PreTrainedModel

    return isinstance(getattr(PreTrainedModel, "loss_function", None), property)


_SETTINGS = ("every_n_layers", "selective", "offload", "plan", *(("head_chunk_size",) if _has_loss_function() else ()),
             "mlp_chunk_size", "patched")


@pytest.fixture(scope="module")
def loaded_by_setting(tmp_path_factory) -> dict[str, dict]:
    """Each setting's training step, each in a process that starts without hf_ckpt: the modules it loaded."""
    plan = str(tmp_path_factory.mktemp("plan") / "plan.json")
    printed = run_fresh(_STEP, [[setting, plan] for setting in _SETTINGS])
    return {setting: json.loads(out.strip().splitlines()[-1]) for setting, out in zip(_SETTINGS, printed)}


@pytest.mark.parametrize("setting", _SETTINGS)
def test_a_training_step_with_a_runtime_setting_loads_no_lab_module(setting, loaded_by_setting):
    loaded = loaded_by_setting[setting]
    assert sorted(name for name in loaded if _lab(name)) == []
    lines = sum(len(Path(file).read_text().splitlines()) for file in loaded.values() if file)
    assert lines <= RUNTIME_LINES, f"{lines} lines of hf_ckpt loaded"


#: The most distinct calls into a higher layer (the contract's ranks) that every entry point may make: enable with
#: each runtime setting, a step and disable, a budget, ``hf_ckpt.plan``, the mixin, the patch,
#: ``hf_ckpt.distributed.apply`` and the Trainer (``ci/climbs.py``).
CLIMBS_BACK = 5


def test_every_entry_point_climbs_back_to_a_higher_layer_at_most_five_times():
    phases = _CLIMBS.measure()
    climbs = set().union(*(followed.climbs for followed in phases.values()))
    assert len(climbs) <= CLIMBS_BACK, _CLIMBS.report(phases)
    assert {"enable plan", "step plan", "enable budget", "plan", "mixin", "patch", "distributed apply",
            "trainer"} <= set(phases)
    assert all(followed.files for followed in phases.values())
    assert phases["enable plan"].extensions  # the runtime calls the kinds, the guard and the unwrappers


@pytest.mark.any_release
def test_the_climb_count_sees_a_runtime_function_calling_the_top_level(tmp_path, monkeypatch):
    package = tmp_path / "toy"
    (package / "runtime").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "top.py").write_text("def api():\n    return 1\n")
    (package / "runtime" / "__init__.py").write_text("")
    (package / "runtime" / "low.py").write_text("from toy import top\n\n\ndef call():\n    return top.api()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from toy.runtime import low

    try:
        followed = _CLIMBS.follow(lambda: [low.call(), low.call()], package)
    finally:
        for name in [name for name in sys.modules if name == "toy" or name.startswith("toy.")]:
            del sys.modules[name]
    assert dict(followed.climbs) == {("toy.runtime.low:call", "toy.top:api"): 2}
    assert len(followed.files) == 2


@pytest.mark.any_release
def test_no_module_imports_another_modules_private_names():
    _, private = _graph()
    assert private == []


@pytest.mark.any_release
def test_the_graph_check_itself_finds_a_cycle_and_a_private_import():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    tree = ast.parse("from .core import _target_model")
    node = tree.body[0]
    assert _resolve("hf_ckpt.mixin", False, node) == "hf_ckpt.core"
    assert node.names[0].name.startswith("_")


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
@pytest.mark.any_release
def test_no_function_is_longer_than_60_lines(path):
    """The largest function (docstring excluded) stays readable."""
    tree = ast.parse(path.read_text())
    long = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                body = body[1:]
            if body:
                length = body[-1].end_lineno - body[0].lineno + 1
                if length > 60:
                    long.append(f"{node.name}: {length} lines")
    assert long == []
