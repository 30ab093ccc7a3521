"""The strategy registry: one place reads a spelling, each kind checks and builds its own function, a new kind is
one class, and a kind's module loads only when a setting uses it."""

from __future__ import annotations

import functools
import json

import pytest
import torch.utils.checkpoint

import hf_ckpt
from hf_ckpt import strategies
from hf_ckpt.strategies import Strategy, parse, register
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
    monkeypatch.setitem(strategies.KIND_MODULES, "counted", __name__)
    register(_Counted)
    try:
        model, batch = tiny_llama(), batch_for(tiny_llama())
        reference = train_step(model, batch)
        hf_ckpt.enable(model, plan=hf_ckpt.CheckpointPlan(strategies=("counted", "none", "counted", "none")))
        recomputed, grads = recomputed_in_step(model, batch)
    finally:
        strategies._registered.pop("counted")
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
