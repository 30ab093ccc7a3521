"""Bench settings by name: the small registry behind ``hf-ckpt bench --settings``.

A *setting* is one named configuration the bench compares (``none``, ``full``, ``every_n:2``,
``upstream:every_n:2``, ``plan:0.5``, ...), spelled ``NAME`` or ``NAME:ARGUMENT``. It is not a per-block
strategy (:class:`hf_ckpt.BlockStrategy`: ``none``/``selective``/``full`` for one block): a setting may assign
different per-block strategies to different blocks (``plan:0.5``), or not be hf_ckpt at all (``upstream:full``,
``compile:0.5``). Each name maps to a factory that parses the argument and returns a :class:`Setting`: how to
switch it on a model and off again. Later features register theirs with :func:`register_setting`::

    register_setting("selective", _selective, syntax="selective", help="...")
"""

from __future__ import annotations

import functools
import inspect
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from torch import nn

from hf_ckpt.runtime import _torch
from hf_ckpt.runtime.apply import apply_request, remove
from hf_ckpt.runtime.request import EnableRequest
from hf_ckpt.runtime.util.warn import warn_once
from hf_ckpt.runtime.util.upstream import original
from hf_ckpt.planning.planner import plan as make_plan
from hf_ckpt.strategies.selective.policy import SELECTIVE_POLICIES
from hf_ckpt.strategies.oplevel.spec import OpLevel
from hf_ckpt.measure._compiled import CompiledReference, compile_unavailable, seeded_unavailable
from hf_ckpt.meters.step import training_step


#: The bench's settings that checkpoint nothing (the baseline), every block and every block selectively.
BASELINE, EVERY_BLOCK, EVERY_BLOCK_SELECTIVE = "none", "full", "selective"


@dataclass(frozen=True)
class Setting:
    """A named configuration the benchmark can switch on and off (``"every_n:2"``, ``"plan:0.5"``).

    Attributes:
        name: The canonical spelling (``"every_n:2"``); the key of the results.
        description: One line for people.
        apply: Switches the setting on for a model (with checkpointing off).
        remove: Switches it off again, leaving the model as ``apply`` found it.
        prepare: Called once with the model (checkpointing off) and the batch before anything is measured, for
            settings that need to look at the workload first (``plan:F`` profiles it to make its plan).
        details: Figures a setting wants reported next to its measurements (a plan's predicted bytes).
    """

    name: str
    description: str
    apply: Callable[[nn.Module], None]
    remove: Callable[[nn.Module], None]
    prepare: Callable[[nn.Module, Mapping[str, Any]], None] | None = None
    details: dict[str, Any] = field(default_factory=dict)


def _enabled(**options: Any) -> Callable[[nn.Module], None]:
    """Switches ``hf_ckpt.enable(model, **options)`` on, through the parsed request as users' calls go."""
    return lambda model: apply_request(model, EnableRequest.of(**options))


@dataclass(frozen=True)
class _Entry:
    factory: Callable[[str | None], Setting]
    syntax: str
    help: str


_REGISTRY: dict[str, _Entry] = {}


def register_setting(name: str, factory: Callable[[str | None], Setting], *, syntax: str, help: str) -> None:
    """Make ``NAME`` and ``NAME:ARGUMENT`` parse to ``factory(argument)`` (``argument`` is None without a colon).

    The factory raises ``ValueError`` with a message naming the accepted values when the argument is wrong.
    Registering a name again replaces the previous factory.
    """
    if not name or ":" in name:
        raise ValueError(f"a setting name must be non-empty and contain no ':'; got {name!r}")
    _REGISTRY[name] = _Entry(factory, syntax, help)


def available_settings() -> dict[str, str]:
    """``{syntax: help}`` for every registered setting, in registration order."""
    return {entry.syntax: entry.help for entry in _REGISTRY.values()}


def _accepted() -> str:
    return ", ".join(entry.syntax for entry in _REGISTRY.values())


def parse_setting(spec: str) -> Setting:
    """The :class:`Setting` spelled ``spec``.

    Raises:
        ValueError: The name is not registered, or its argument is wrong; the message lists what is accepted.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"a setting must be a non-empty string, one of: {_accepted()}; got {spec!r}")
    name, colon, argument = spec.strip().partition(":")
    entry = _REGISTRY.get(name)
    if entry is None:
        raise ValueError(f"unknown setting {spec!r}; accepted: {_accepted()}")
    return entry.factory(argument if colon else None)


def parse_settings(specs: str) -> list[Setting]:
    """Parse a comma-separated list (``"none,full,every_n:2"``); names must not repeat."""
    settings = [parse_setting(spec) for spec in specs.split(",")]
    names = [setting.name for setting in settings]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"setting given more than once: {', '.join(repeated)}")
    return settings


# -- the built-in settings -- ----------------------------------------------------------------------------------


def _no_argument(name: str, argument: str | None) -> None:
    if argument is not None:
        raise ValueError(f"setting {name!r} takes no argument; got {name}:{argument}")


def _every_n(argument: str | None, spelled: str = "every_n") -> int:
    try:
        value = int(argument) if argument is not None else 0
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(
            f"{spelled} needs a positive int (every_n:2 recomputes every other block); got {spelled}:{argument or ''}"
        )
    return value


def _none(argument: str | None) -> Setting:
    _no_argument("none", argument)
    return Setting("none", "no checkpointing", apply=remove, remove=remove)


def _full(argument: str | None) -> Setting:
    _no_argument("full", argument)
    return Setting("full", "hf_ckpt.enable(model): every block", apply=_enabled(), remove=remove)


def _every_n_setting(argument: str | None) -> Setting:
    n = _every_n(argument)
    return Setting(
        f"every_n:{n}",
        f"hf_ckpt.enable(model, every_n_layers={n})",
        apply=_enabled(every_n_layers=n),
        remove=remove,
    )


def _offload(argument: str | None) -> Setting:
    _no_argument("offload", argument)
    return Setting(
        "offload",
        "hf_ckpt.enable(model, offload=True): every block, saved inputs in host memory",
        apply=_enabled(offload=True),
        remove=remove,
    )


def _head(argument: str | None) -> Setting:
    try:
        tokens = int(argument) if argument is not None else 0
    except ValueError:
        tokens = 0
    if tokens < 1:
        raise ValueError(f"head needs a positive int, the tokens per chunk (head:512); got head:{argument or ''}")
    return Setting(
        f"head:{tokens}",
        f"hf_ckpt.enable(model, head_chunk_size={tokens}): every block, the LM head and loss in chunks of "
        f"{tokens} tokens",
        apply=_enabled(head_chunk_size=tokens),
        remove=remove,
    )


def _mlp(argument: str | None) -> Setting:
    try:
        tokens = int(argument) if argument is not None else 0
    except ValueError:
        tokens = 0
    if tokens < 1:
        raise ValueError(f"mlp needs a positive int, the tokens per chunk (mlp:4096); got mlp:{argument or ''}")
    return Setting(
        f"mlp:{tokens}",
        f"hf_ckpt.enable(model, mlp_chunk_size={tokens}): every block, each block's MLP in chunks of {tokens} tokens",
        apply=_enabled(mlp_chunk_size=tokens),
        remove=remove,
    )


def _upstream_functions() -> tuple[str, Any, Any]:
    """transformers' own enable/disable functions (the originals, if ``hf_ckpt.patch_transformers`` is active)."""
    from transformers import PreTrainedModel

    prefix = "activation" if "activation_checkpointing_enable" in PreTrainedModel.__dict__ else "gradient"
    name = f"{prefix}_checkpointing_enable"
    return name, original(name), original(f"{prefix}_checkpointing_disable")


def _upstream(argument: str | None) -> Setting:
    import transformers

    accepted = "upstream:full or upstream:every_n:N"
    if argument is None:
        raise ValueError(f"upstream needs the setting to compare, {accepted}; got upstream")
    inner, colon, inner_argument = argument.partition(":")
    if inner == EVERY_BLOCK and not colon:
        n = 1
    elif inner == "every_n":
        n = _every_n(inner_argument if colon else None, spelled="upstream:every_n")
    else:
        raise ValueError(f"upstream compares only {accepted}; got upstream:{argument}")

    method, upstream_enable, upstream_disable = _upstream_functions()
    options: dict[str, Any] = {}
    if n > 1:
        if "every_n_layers" not in inspect.signature(upstream_enable).parameters:
            raise ValueError(
                f"upstream:every_n:{n} cannot run: transformers {transformers.__version__}'s "
                f"PreTrainedModel.{method} has no every_n_layers argument (use upstream:full)"
            )
        options["every_n_layers"] = n

    added_input_hooks: "weakref.WeakKeyDictionary[nn.Module, bool]" = weakref.WeakKeyDictionary()

    def has_input_hooks(model: nn.Module) -> bool:
        return hasattr(model, "_require_grads_hook") or hasattr(model, "_require_grads_hooks")

    def apply(model: nn.Module) -> None:
        had_input_hooks = has_input_hooks(model)
        upstream_enable(model, {"use_reentrant": False}, **options)
        added_input_hooks[model] = not had_input_hooks and has_input_hooks(model)

    def remove(model: nn.Module) -> None:
        upstream_disable(model)
        # Upstream's enable may register an input-grads hook on every call, which its disable keeps outside PEFT:
        # take away the one this apply added, so that switching settings does not pile hooks up.
        if added_input_hooks.pop(model, False) and hasattr(model, "disable_input_require_grads"):
            model.disable_input_require_grads()
            for attribute in ("_require_grads_hook", "_require_grads_hooks"):
                model.__dict__.pop(attribute, None)

    setting = "every block" if n == 1 else f"every_n_layers={n}"
    return Setting(
        f"upstream:{'full' if n == 1 else f'every_n:{n}'}",
        f"transformers' own {method} ({setting}, use_reentrant=False)",
        apply=apply,
        remove=remove,
    )


def upstream_supports(argument: str) -> bool:
    """Whether ``upstream:ARGUMENT`` can run with the installed transformers."""
    try:
        _upstream(argument)
    except ValueError:
        return False
    return True


def _selective(argument: str | None) -> Setting:
    if argument is not None and argument not in SELECTIVE_POLICIES:
        raise ValueError(
            f"selective takes a policy name, one of {', '.join(sorted(SELECTIVE_POLICIES))}; got selective:{argument}"
        )
    policy = argument
    return Setting(
        "selective" if policy is None else f"selective:{policy}",
        f"hf_ckpt.enable(model, strategy='selective'{'' if policy is None else f', policy={policy!r}'}): every "
        "block, matmul and attention outputs kept, cheap ops recomputed",
        apply=_enabled(strategy="selective", policy=policy),
        remove=remove,
    )


def _fraction(argument: str | None, name: str = "plan") -> float:
    try:
        value = float(argument) if argument is not None else 0.0
    except ValueError:
        value = 0.0
    if not 0.0 < value <= 1.0:
        raise ValueError(
            f"{name} needs the budget as a fraction of the no-checkpointing activation memory in (0, 1], "
            f"e.g. {name}:0.5; got {name}:{argument or ''}"
        )
    return value


def _planned(name: str, fraction: float, description: str, strategies: tuple[str, ...] | None = None) -> Setting:
    """A setting that makes an ``hf_ckpt.plan`` for ``fraction`` of none's memory on the bench's batch (in
    ``prepare``) and applies it; the plan's per-block strategies and predictions go into ``details``."""
    made: dict[str, Any] = {}
    details: dict[str, Any] = {}

    def prepare(model: nn.Module, batch: Mapping[str, Any]) -> None:
        options = {} if strategies is None else {"strategies": strategies}
        plan = made["plan"] = make_plan(model, batch, fraction, **options)
        details.update(strategies=list(plan.strategies))
        if strategies is not None and OpLevel.kind in strategies:
            details.update(policies={key: list(saved) for key, saved in plan.policies.items()})
        if plan.outside_blocks:
            details.update(outside_blocks=list(plan.outside_blocks))
        details.update(
            predicted_bytes=plan.predicted_bytes,
            predicted_recompute_flops=plan.predicted_recompute_flops,
            budget_bytes=plan.budget_bytes,
        )

    def apply(model: nn.Module) -> None:
        if "plan" not in made:
            raise RuntimeError(f"{name}:{fraction:g} was applied before it was prepared on a batch")
        apply_request(model, EnableRequest.of(plan=made["plan"]))

    return Setting(
        f"{name}:{fraction:g}", description, apply=apply, remove=remove, prepare=prepare, details=details
    )


def _plan(argument: str | None) -> Setting:
    fraction = _fraction(argument)
    return _planned(
        "plan",
        fraction,
        f"hf_ckpt.plan(model, batch, {fraction:g}): the least recompute within {fraction:.0%} of none's memory",
    )


def _finer_plan(name: str, extra: tuple[str, ...], options: str) -> Any:
    """The factory of a setting planned with op-level strategies ``extra`` among the block-level ones."""

    def factory(argument: str | None) -> Setting:
        fraction = _fraction(argument, name)
        return _planned(
            name,
            fraction,
            f"hf_ckpt.plan(model, batch, {fraction:g}, strategies=(..., {', '.join(map(repr, extra))})): per block "
            f"{options}, the least recompute within {fraction:.0%} of none's memory",
            strategies=("none", "selective", "full", *extra),
        )

    return factory


_oplevel = _finer_plan("oplevel", ("oplevel",), "none/full/selective or an op-level policy")
_graphplan = _finer_plan("graphplan", ("oplevel", "partition", "outside"),
                         "none/full/selective, an op-level policy or a partitioned graph, and the cheap modules between "
                         "the blocks recomputed where that pays")


def _compiled_reference(name: str, keep_random: bool) -> Callable[[str | None], Setting]:
    """The factory of ``compile:F`` (inductor as torch ships it) or ``compile_seeded:F`` (its random seeds kept)."""

    def factory(argument: str | None) -> Setting:
        try:
            value = float(argument) if argument is not None else -1.0
        except ValueError:
            value = -1.0
        if not (0.0 < value <= 1.0 if keep_random else 0.0 <= value <= 1.0):
            accepted = "in (0, 1] (at 0 torch's partitioner ignores what it must keep)" if keep_random else "in [0, 1]"
            raise ValueError(
                f"{name} needs {_torch.ACTIVATION_MEMORY_BUDGET} {accepted}, e.g. {name}:0.5; "
                f"got {name}:{argument or ''}"
            )
        reason = compile_unavailable() or (seeded_unavailable() if keep_random else None)
        if reason is not None:
            raise ValueError(f"{name}:{value:g} cannot run: {reason}; leave it out of --settings")
        reference = CompiledReference(value, keep_random=keep_random)
        details: dict[str, Any] = {}
        what = "with its random seeds saved for backward" if keep_random else "as torch ships it"
        return Setting(
            reference.name,
            f"torch.compile(model, backend='inductor') with activation_memory_budget={value:g} (min-cut partitioner), "
            f"{what}; under the bench's dispatch modes dynamo runs eagerly, so its memory and FLOPs are in details "
            "(saved_bytes, graph_flops, backward_random; benchmarks/oplevel_budget.py compares them)",
            apply=reference.apply,
            remove=reference.remove,
            prepare=functools.partial(_measure_compiled, reference, details),
            details=details,
        )

    return factory


def _measure_compiled(reference: Any, details: dict[str, Any], model: nn.Module, batch: Mapping[str, Any]) -> None:
    """Compile ``reference`` for the batch and put its figures in ``details``; warn once where its backward draws
    random numbers afresh."""
    reference.prepare(model, batch, lambda: training_step(model, batch))
    saved_bytes, graph_flops = reference.measure(model, batch)
    details.update(saved_bytes=saved_bytes, graph_flops=graph_flops, backward_random=reference.backward_random)
    if reference.backward_random:
        warn_once(
            f"{reference.name}: the compiled backward draws {reference.backward_random} random op(s) afresh "
            "(pytorch/pytorch#190758): its dropout masks are not the forward's, so its gradients are wrong and its "
            "saved bytes leave out what a correct replay keeps; compile_seeded:F (F in (0, 1]) keeps the seeds.",
            key=f"compile-random:{reference.name}",
        )
    model.zero_grad(set_to_none=True)


_compile = _compiled_reference("compile", keep_random=False)
_compile_seeded = _compiled_reference("compile_seeded", keep_random=True)


#: The built-in settings, in the order ``available_settings`` lists them: (name, factory, syntax, help).
_BUILT_IN = (
    ("none", _none, "none",
     "no checkpointing (the baseline every ratio is relative to)"),
    ("full", _full, "full",
     "hf_ckpt.enable(model): recompute every block"),
    ("every_n", _every_n_setting, "every_n:N",
     "hf_ckpt.enable(model, every_n_layers=N): blocks 0, N, 2N, ..."),
    ("offload", _offload, "offload",
     "hf_ckpt.enable(model, offload=True): every block, inputs kept on host"),
    ("head", _head, "head:N",
     "hf_ckpt.enable(model, head_chunk_size=N): every block, a causal LM's head and loss in checkpointed chunks"),
    ("mlp", _mlp, "mlp:N",
     "hf_ckpt.enable(model, mlp_chunk_size=N): every block, each block's MLP in checkpointed chunks of N tokens"),
    ("upstream", _upstream, "upstream:full|upstream:every_n:N",
     "the same setting through transformers' own activation/gradient_checkpointing_enable"),
    ("selective", _selective, "selective[:POLICY]",
     "hf_ckpt.enable(model, strategy='selective'): keep matmul/attention outputs, recompute the cheap ops"),
    ("plan", _plan, "plan:F",
     "hf_ckpt.plan(model, batch, F): per-block plan fitting F x none's activation memory at the least recompute"),
    ("oplevel", _oplevel, "oplevel:F",
     "hf_ckpt.plan(..., strategies=(..., 'oplevel')): per-block or per-op policies within F x none's memory"),
    ("graphplan", _graphplan, "graphplan:F",
     "hf_ckpt.plan(..., strategies=(..., 'oplevel', 'partition', 'outside')): oplevel:F, blocks' graphs "
     "partitioned, cheap modules between the blocks recomputed"),
    ("compile", _compile, "compile:F",
     f"torch.compile (inductor) with {_torch.ACTIVATION_MEMORY_BUDGET}=F, the min-cut reference"),
    ("compile_seeded", _compile_seeded, "compile_seeded:F",
     "compile:F with the random seeds kept for backward, which replays the forward's dropout masks "
     "(compile:F draws them afresh where it recomputes them: pytorch/pytorch#190758)"),
)
for _name, _factory, _syntax, _help in _BUILT_IN:
    register_setting(_name, _factory, syntax=_syntax, help=_help)
