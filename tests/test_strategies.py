"""The strategy registry: one place reads a spelling, each kind checks and builds its own function, a new kind is
one registered class, and a kind's module loads only when a setting uses it."""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

import pytest
import torch.utils.checkpoint

import hf_ckpt
from hf_ckpt import strategies
from hf_ckpt.runtime import kinds as registry
from hf_ckpt.strategies import Strategy, parse, register
from hf_ckpt.strategies import FINER_CHOICES, OUTSIDE, PLANNER_CHOICES
from fresh import run_fresh
from helpers import batch_for, max_grad_diff, recomputed_in_step, tiny_llama, train_step


@pytest.mark.parametrize("spelling, kind", [
    ("none", "none"), ("full", "full"), ("selective", "selective"), ("oplevel:a", "oplevel"),
    ("partition:0.5", "partition"), ("partition:1:norms", "partition"),
])
@pytest.mark.any_release
def test_each_spelling_parses_to_its_kind_and_back(spelling, kind):
    strategy = parse(spelling, {"a": ("aten.mm.default#0",)})
    assert strategy.kind == kind and strategy.spelling == spelling
    assert strategy.recomputes == (kind != "none")


@pytest.mark.any_release
def test_spellings_are_normalised_as_plans_store_them():
    assert parse("partition:.50").spelling == "partition:0.5"
    assert parse(hf_ckpt.BlockStrategy.SELECTIVE).spelling == "selective"


@pytest.mark.parametrize("value, message", [
    ("bogus", "each plan strategy must be one of 'none', 'selective', 'full'; got 'bogus' (or 'oplevel:<name>'"),
    ("full:2", "got 'full:2'"),
    (3, "got 3"),
    ("oplevel:missing", "each plan strategy 'oplevel:<name>' must name a key of policies (a); got 'oplevel:missing'"),
    ("partition:2", "the budget of plan strategy 'partition:2' ('partition:<F>' or 'partition:<F>:norms') must be a "
                    "number in [0, 1]"),
])
@pytest.mark.any_release
def test_a_bad_spelling_names_what_is_accepted(value, message):
    with pytest.raises(ValueError) as raised:
        parse(value, {"a": ("aten.mm.default#0",)})
    assert message in str(raised.value)


def test_checkpoint_fn_is_refused_with_a_plan_of_oplevel_blocks():
    plan = hf_ckpt.CheckpointPlan(strategies=("oplevel:a", "none", "none", "none"),
                                  policies={"a": ("aten.mm.default#0",)})
    with pytest.raises(ValueError, match="checkpoint_fn cannot be combined with a plan with oplevel blocks"):
        hf_ckpt.enable(tiny_llama(), plan=plan, checkpoint_fn=torch.utils.checkpoint.checkpoint)


class _Counted(Strategy):
    """A kind defined outside the package: full recompute through a function that counts its calls."""

    kind = "counted"
    calls = 0

    def checkpoint_function(self, config, checkpoint_kwargs, wrap):
        plain = wrap(dict(checkpoint_kwargs))

        def counted(function, *args, **kwargs):
            type(self).calls += 1
            return plain(function, *args, **kwargs)

        return functools.wraps(plain.func)(counted)


def test_a_new_kind_is_one_registered_class(monkeypatch):
    register(_Counted)
    try:
        model, batch = tiny_llama(), batch_for(tiny_llama())
        reference = train_step(model, batch)
        hf_ckpt.enable(model, plan=hf_ckpt.CheckpointPlan(strategies=("counted", "none", "counted", "none")))
        recomputed, grads = recomputed_in_step(model, batch)
    finally:
        registry._registered.pop("counted")
    assert recomputed == [0, 2]
    assert _Counted.calls == 2
    assert max_grad_diff(reference, grads) < 1e-6


_LOADED = """
import json, sys, torch
import hf_ckpt
from transformers import LlamaConfig, LlamaForCausalLM
model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1)).train()
hf_ckpt.enable(model, plan=hf_ckpt.CheckpointPlan(strategies=tuple(sys.argv[1].split(","))))
ids = torch.randint(0, 32, (1, 8))
model(input_ids=ids, labels=ids).loss.backward()
print(json.dumps(sorted(name for name in sys.modules if name.startswith("hf_ckpt"))))
"""


_PLANS = ("full,none", "selective,full", "partition:0.5,full")


@pytest.fixture(scope="module")
def loaded_by_plan() -> dict[str, list[str]]:
    """Each plan's training step, each in a process that starts without hf_ckpt: the hf_ckpt modules it loaded."""
    printed = run_fresh(_LOADED, [[plan] for plan in _PLANS])
    return {plan: json.loads(out.strip().splitlines()[-1]) for plan, out in zip(_PLANS, printed)}


@pytest.mark.parametrize("plan, loaded, not_loaded", [
    ("full,none", [], ["hf_ckpt.strategies.selective.spec", "hf_ckpt.strategies.partition.spec", "hf_ckpt.strategies.partition.graph",
                       "hf_ckpt.strategies.outside.hook", "hf_ckpt.strategies.partition.boundary"]),
    ("selective,full", ["hf_ckpt.strategies.selective.spec"], ["hf_ckpt.strategies.partition.spec", "hf_ckpt.strategies.outside.hook"]),
    ("partition:0.5,full", ["hf_ckpt.strategies.partition.spec", "hf_ckpt.strategies.partition.graph", "hf_ckpt.strategies.outside.hook"],
     ["hf_ckpt.strategies.selective.spec"]),
])
def test_a_kinds_module_loads_only_when_a_setting_uses_it(plan, loaded, not_loaded, loaded_by_plan):
    modules = set(loaded_by_plan[plan])
    assert set(loaded) <= modules and not set(not_loaded) & modules


_PACKAGE = Path(hf_ckpt.__file__).parent
#: The registry's names for kinds and planner choices, and its constants that hold them (comparing with
#: ``CheckpointConfig.strategy``, the default, asks whether a strategy was given, whatever its kind).
_NAMES = {*strategies.kinds(), *FINER_CHOICES}
_CONSTANTS = {"NONE", "FULL", "SELECTIVE"}
def _names_a_kind(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.partition(":")[0] in _NAMES
    if isinstance(node, (ast.Name, ast.Attribute)):
        return (node.id if isinstance(node, ast.Name) else node.attr) in _CONSTANTS
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_names_a_kind(e) for e in node.elts)


def _kind_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, expression) of each comparison in ``source`` with a kind's name: ``==``, ``!=``, ``in`` (either
    side, literal collections included) and ``startswith``/``endswith``, against a literal or a registry constant.
    A sharding's ``"none"`` (an operand that names ``shard``) is another word."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = (node.left, *node.comparators)
            if any(map(_names_a_kind, operands)) and "shard" not in ast.unparse(node):
                found.append((node.lineno, ast.unparse(node)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith") and node.args and _names_a_kind(node.args[0])):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_strategy_name_is_compared_outside_the_registry():
    """Adding a kind is one folder and one registration: outside ``hf_ckpt/strategies/`` and the registry
    (``runtime/kinds.py``) the package asks the registry or the kind (``recomputes``, ``takes_policy``, ``refuses``,
    ``keeps_everything``, ...), never compares a spelling. Other namespaces that share a word (the bench's settings,
    the estimate's rows, shardings) name theirs with their own constants. No exception."""
    found = []
    for path in sorted(_PACKAGE.rglob("*.py")):
        relative = path.relative_to(_PACKAGE).as_posix()
        if relative.startswith("strategies/") or relative == "runtime/kinds.py":
            continue
        found += [f"hf_ckpt/{relative}:{line}: {text}" for line, text in _kind_comparisons(path.read_text())]
    assert not found, "strategy names compared outside hf_ckpt/strategies/:\n" + "\n".join(found)


@pytest.mark.parametrize("line", [
    'x = 1 if self.strategy == "selective" else 0', "x = s != 'none'", 'x = s in ("none", "full")',
    "x = s.startswith('partition:')", 'x = "oplevel" in strategies', "x = self.strategy != FULL",
])
def test_the_comparison_check_sees_each_form(line):
    assert _kind_comparisons(line)
    for kind, other in (("selective", "uniform"), ("none", "zero3"), ("full", "auto"), ("partition", "every_n"),
                        ("oplevel", "policy"), ("FULL", "TWO")):
        line = line.replace(kind, other)
    assert not _kind_comparisons(line)


def test_every_kind_names_only_known_modifiers_and_partition_refuses_them_all():
    """The one table of which kind takes which modifier: each kind's ``refuses``, read by every check."""
    for kind in strategies.kinds():
        assert strategies.strategy_class(kind).refuses <= set(strategies.MODIFIERS), kind
    assert strategies.strategy_class("partition").refuses == set(strategies.MODIFIERS)
    assert strategies.strategy_class("selective").refuses == {"use_reentrant=True", "checkpoint_fn", "context_fn"}
    assert not strategies.strategy_class("full").refuses


def test_outside_is_a_planner_choice_and_no_kind():
    assert OUTSIDE in PLANNER_CHOICES and OUTSIDE not in strategies.kinds()
    with pytest.raises(ValueError, match="each plan strategy must be one of"):
        hf_ckpt.CheckpointPlan(("outside",))
