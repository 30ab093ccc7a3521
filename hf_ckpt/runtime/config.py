"""``CheckpointConfig``: what to checkpoint and how, validated when the user asks for it.

Every entry point (``hf_ckpt.enable``, the mixin, the patched ``transformers`` methods, the stock ``Trainer``)
parses its arguments once into an :class:`~hf_ckpt.runtime.request.EnableRequest` (a budget, its sample batch and
loop, and the config made by :meth:`CheckpointConfig.from_arguments`), so bad input fails at the call that carried
it, with a message that names the argument and the values it accepts, and never three layers deep at the first
training step. Checks that need the model (an index past the last block) run in :meth:`CheckpointConfig.resolve`,
still inside the enable call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from hf_ckpt.runtime import _torch
from hf_ckpt.runtime.util.compat import checkpoint_keyword_names
from hf_ckpt.runtime.plans import CheckpointPlan
from hf_ckpt.runtime.selection import (
    SELECTION_METHODS,
    check_layers_in_range,
    check_num_layers_in_range,
    every_nth,
)
from hf_ckpt.runtime.kinds import SELECTIVE, WHOLE_MODEL_STRATEGIES, Strategy, parse, strategy_class

#: Keys of a checkpointing kwargs dict that hf_ckpt consumes itself; every other key goes to
#: ``torch.utils.checkpoint.checkpoint``.
HF_CKPT_KEYS = (
    "every_n_layers", "layers", "num_layers", "method", "strategy", "policy", "plan", "offload", "checkpoint_fn",
    "head_chunk_size", "mlp_chunk_size",
)


_EVERY_N_ACCEPTS = "a positive int (1 checkpoints every block, 2 every other block, ...)"


def _type_name(value: Any) -> str:
    return type(value).__name__


def _check_every_n_layers(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"every_n_layers must be {_EVERY_N_ACCEPTS}; got {value!r} of type {_type_name(value)}")
    if value < 1:
        raise ValueError(f"every_n_layers must be {_EVERY_N_ACCEPTS}; got {value!r}")
    return value


_HEAD_CHUNK_ACCEPTS = "a positive int (tokens per chunk of the output projection and loss) or None (no chunking)"


def _check_head_chunk_size(value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"head_chunk_size must be {_HEAD_CHUNK_ACCEPTS}; got {value!r} of type {_type_name(value)}")
    if value is not None and value < 1:
        raise ValueError(f"head_chunk_size must be {_HEAD_CHUNK_ACCEPTS}; got {value!r}")


_MLP_CHUNK_ACCEPTS = "a positive int (tokens per chunk of each block's MLP) or None (no chunking)"


def _check_mlp_chunk_size(value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"mlp_chunk_size must be {_MLP_CHUNK_ACCEPTS}; got {value!r} of type {_type_name(value)}")


def _check_offload(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"offload must be True or False; got {value!r} of type {_type_name(value)}")
    return value


def _check_layers(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"layers must be a list of block indices (ints); got {value!r} of type {_type_name(value)}")
    layers = tuple(value)
    bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int)]
    if bad:
        raise TypeError(f"layers must be a list of block indices (ints); got {bad[0]!r} of type {_type_name(bad[0])}")
    if not layers:
        raise ValueError("layers must name at least one block index; to checkpoint nothing, call hf_ckpt.disable")
    if len(set(layers)) != len(layers):
        raise ValueError(f"layers must not repeat an index; got {list(layers)}")
    return tuple(sorted(layers))


def _check_num_layers(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"num_layers must be a positive int (how many blocks to checkpoint); got {value!r} of type {_type_name(value)}")
    if value < 1:
        raise ValueError(f"num_layers must be a positive int (how many blocks to checkpoint); got {value!r}")
    return value


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")


_BOOLEAN_KWARGS = ("use_reentrant", "preserve_rng_state", "debug", "early_stop")


def _determinism_checks() -> tuple[str, ...]:
    return _torch.determinism_checks()


def _check_checkpoint_kwargs(kwargs: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Names *and values* of the keyword arguments for ``torch.utils.checkpoint.checkpoint``."""
    accepted = checkpoint_keyword_names()
    for key in kwargs:
        if key not in accepted:
            raise TypeError(
                f"Unknown checkpoint keyword argument {key!r} in {source}. torch.utils.checkpoint.checkpoint "
                f"accepts: {', '.join(accepted)}; hf_ckpt itself accepts: {', '.join(HF_CKPT_KEYS)}."
            )
    checked = dict(kwargs)
    checked.setdefault("use_reentrant", False)
    for name in _BOOLEAN_KWARGS:
        if name in checked and not isinstance(checked[name], bool):
            raise TypeError(f"{name} must be True or False; got {checked[name]!r} of type {_type_name(checked[name])}")
    if "determinism_check" in checked:
        _check_choice("determinism_check", checked["determinism_check"], _determinism_checks())
    if "context_fn" in checked and not callable(checked["context_fn"]):
        raise TypeError(
            "context_fn must be a callable returning two context managers (forward, recompute); "
            f"got {checked['context_fn']!r} of type {_type_name(checked['context_fn'])}"
        )
    return checked


def checkpoint_fn_keywords(checkpoint_fn: Any) -> tuple[str, ...]:
    """The keyword arguments ``checkpoint_fn`` names in its signature (after the function it checkpoints). A
    ``**kwargs`` catch-all does not count: ``deepspeed.checkpointing.checkpoint`` passes those on to the block."""
    import inspect

    try:
        parameters = list(inspect.signature(checkpoint_fn).parameters.values())
    except (TypeError, ValueError):
        return ()
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in parameters[1:] if p.kind in named)


def _check_checkpoint_fn(checkpoint_fn: Any, given: Mapping[str, Any], source: str) -> None:
    """``checkpoint_fn`` is callable and names every checkpoint keyword argument the user gave."""
    if not callable(checkpoint_fn):
        raise TypeError(
            "checkpoint_fn must be a function with torch.utils.checkpoint.checkpoint's calling convention, "
            f"checkpoint_fn(function, *args, **kwargs), e.g. deepspeed.checkpointing.checkpoint; got {_type_name(checkpoint_fn)}"
        )
    accepted = checkpoint_fn_keywords(checkpoint_fn)
    refused = [key for key in given if key not in accepted]
    if refused:
        name = getattr(checkpoint_fn, "__qualname__", type(checkpoint_fn).__name__)
        raise TypeError(
            f"checkpoint_fn={name} does not take {', '.join(repr(k) for k in refused)} (from {source}), so it "
            f"cannot honour {'it' if len(refused) == 1 else 'them'}; it takes: {', '.join(accepted) or 'no keyword arguments'}. "
            "Drop them, or leave checkpoint_fn unset to use torch.utils.checkpoint.checkpoint."
        )


def _load_plan(plan: Any) -> Any:
    if plan is None or isinstance(plan, CheckpointPlan):
        return plan
    if isinstance(plan, (str, os.PathLike)):
        return CheckpointPlan.load(plan)
    raise TypeError(
        f"plan must be a CheckpointPlan or the path (str or os.PathLike) of a plan saved as JSON; got {_type_name(plan)}"
    )


@dataclass(frozen=True)
class CheckpointConfig:
    """A validated checkpointing setting.

    Selection (give at most one of ``every_n_layers`` > 1, ``layers``, ``num_layers``, ``plan``):

    Attributes:
        every_n_layers: Checkpoint blocks ``0, n, 2n, ...``, counting only the repeated per-layer blocks in global
            order (encoder blocks, then decoder blocks). ``1`` checkpoints every block.
        layers: Explicit block indices to checkpoint.
        num_layers: How many blocks to checkpoint, placed by ``method``.
        method: ``"uniform"`` (spread evenly, the default) or ``"block"`` (the first ``num_layers``); see
            :mod:`hf_ckpt.runtime.selection` to register more.
        strategy: What happens to each selected block: ``"full"`` recomputes the whole block, ``"selective"``
            keeps the outputs of matmuls and attention and recomputes the cheap ops in between.
        policy: For ``"selective"``: a policy name (``"matmuls_and_attention"``, ``"matmuls"``, ``"attention"``),
            a list of aten ops to save, or a callable ``(ctx, op, *args, **kwargs) -> CheckpointPolicy``.
        plan: A :class:`~hf_ckpt.CheckpointPlan` giving a strategy per block (from :func:`hf_ckpt.plan`).
        offload: Keep the inputs saved for the recompute in host memory (pinned) instead of on the accelerator.
            On a machine without an accelerator there is nothing to offload: plain checkpointing runs, with one
            warning.
        checkpoint_kwargs: Passed to ``torch.utils.checkpoint.checkpoint``. ``use_reentrant`` is always present
            and defaults to ``False``.
        checkpoint_fn: Checkpoint the selected blocks with this function instead of
            ``torch.utils.checkpoint.checkpoint``: any function with its calling convention,
            ``checkpoint_fn(function, *args, **kwargs)``, e.g. ``deepspeed.checkpointing.checkpoint``. It gets only
            the checkpoint keyword arguments its signature names; it cannot be combined with ``offload``,
            ``strategy="selective"`` (or a plan with selective blocks) or ``context_fn``.
        head_chunk_size: For a causal LM: run the output projection and the loss of a training step with labels
            over this many tokens at a time, each chunk checkpointed (:mod:`hf_ckpt.runtime.head`); ``None``: not chunked.
        mlp_chunk_size: Run every block's MLP over this many tokens at a time, each chunk checkpointed, with grad
            enabled (:mod:`hf_ckpt.runtime.mlp_chunks`); ``None``: not chunked.
    """

    every_n_layers: int = 1
    layers: tuple[int, ...] | None = None
    num_layers: int | None = None
    method: str | None = None
    strategy: str = "full"
    policy: Any = None
    plan: Any = None
    offload: bool = False
    checkpoint_kwargs: Mapping[str, Any] = field(default_factory=lambda: {"use_reentrant": False})
    checkpoint_fn: Any = None
    head_chunk_size: int | None = None
    mlp_chunk_size: int | None = None

    def __post_init__(self) -> None:
        _check_every_n_layers(self.every_n_layers)
        _check_head_chunk_size(self.head_chunk_size)
        _check_mlp_chunk_size(self.mlp_chunk_size)
        _check_offload(self.offload)
        object.__setattr__(self, "layers", _check_layers(self.layers))
        _check_num_layers(self.num_layers)
        object.__setattr__(self, "plan", _load_plan(self.plan))
        if self.head_chunk_size is None and self.plan is not None:
            object.__setattr__(self, "head_chunk_size", self.plan.head_chunk_size)
        object.__setattr__(
            self, "checkpoint_kwargs", _check_checkpoint_kwargs(self.checkpoint_kwargs, "checkpoint_kwargs")
        )
        _check_choice("strategy", self.strategy, WHOLE_MODEL_STRATEGIES)
        object.__setattr__(self, "strategy", str(self.strategy))
        if self.method is not None:
            _check_choice("method", self.method, tuple(SELECTION_METHODS))
            if self.num_layers is None:
                raise ValueError("method only applies together with num_layers; give num_layers too")
        if self.policy is not None:
            strategy_class(SELECTIVE).check_policy(self.policy)
        self._check_exclusive()
        kinds = self.strategies()
        self._check_policy(kinds)
        self._check_checkpoint_fn(kinds)
        for strategy in kinds:
            strategy.check(self)

    def strategies(self) -> tuple[Strategy, ...]:
        """The distinct strategies of the checkpointed (recomputed) blocks, as the plan (or ``strategy``) spells them."""
        spellings = set(self.plan.strategies) if self.plan is not None else {self.strategy}
        policies = self.plan.policies if self.plan is not None else None
        parsed = (parse(spelling, policies) for spelling in sorted(spellings))
        return tuple(strategy for strategy in parsed if strategy.recomputes)

    def _check_policy(self, kinds: tuple[Strategy, ...]) -> None:
        if self.policy is not None and not any(s.takes_policy for s in kinds):
            raise ValueError('policy only applies to strategy="selective"; set strategy="selective" or drop policy')

    def _check_checkpoint_fn(self, kinds: tuple[Strategy, ...]) -> None:
        if self.checkpoint_fn is None:
            return
        _check_checkpoint_fn(self.checkpoint_fn, {}, "checkpoint_kwargs")
        # the kinds that refuse checkpoint_fn and leave naming it to this check (Strategy.refuses, names_refusals)
        by_kind = sorted(s.kind for s in kinds if "checkpoint_fn" in s.refused(self) and not s.names_refusals)
        named = [f'strategy="{self.strategy}"' if self.plan is None else f"a plan with {kind} blocks" for kind in by_kind]
        refused = [
            name
            for name, active in (
                ("offload=True", self.offload),
                *((name, True) for name in named),
                ("context_fn", "context_fn" in self.checkpoint_kwargs),
            )
            if active
        ]
        if refused:
            raise ValueError(
                f"checkpoint_fn cannot be combined with {' and '.join(refused)}: those work through "
                "torch.utils.checkpoint.checkpoint's hooks and context_fn, which a custom checkpoint function does "
                "not have. Drop checkpoint_fn, or drop them."
            )

    def _check_exclusive(self) -> None:
        given = [
            name
            for name, active in (
                ("every_n_layers", self.every_n_layers != 1),
                ("layers", self.layers is not None),
                ("num_layers", self.num_layers is not None),
                ("plan", self.plan is not None),
            )
            if active
        ]
        if self.plan is not None and self.strategy != CheckpointConfig.strategy:  # given, with a plan
            given.append("strategy")
        if len(given) > 1:
            raise ValueError(
                f"{' and '.join(given)} select blocks in different ways; give only one of every_n_layers, layers, "
                "num_layers (with method) and plan"
            )

    @property
    def use_reentrant(self) -> bool:
        return bool(self.checkpoint_kwargs["use_reentrant"])

    def describe(self) -> str:
        """The setting as keyword arguments, for messages: ``every_n_layers=2, use_reentrant=False``."""
        parts = [f"every_n_layers={self.every_n_layers}"]
        for name in ("layers", "num_layers", "method", "policy"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}={list(value) if name == 'layers' else value!r}")
        if self.strategy != CheckpointConfig.strategy:
            parts.append(f"strategy={self.strategy!r}")
        if self.plan is not None:
            parts.append(f"plan=<{self.plan.summary()}>")
        if self.offload:
            parts.append("offload=True")
        if self.head_chunk_size is not None:
            parts.append(f"head_chunk_size={self.head_chunk_size}")
        if self.mlp_chunk_size is not None:
            parts.append(f"mlp_chunk_size={self.mlp_chunk_size}")
        parts.extend(f"{key}={value!r}" for key, value in sorted(self.checkpoint_kwargs.items()))
        return ", ".join(parts)

    def resolve(self, num_blocks: int) -> dict[int, Strategy]:
        """The strategy of each checkpointed block, for a model with ``num_blocks`` repeated blocks."""
        if self.plan is not None:
            self.plan.check_fits(num_blocks)
            kinds = {s.spelling: s for s in self.strategies()}
            return {i: kinds[s] for i, s in enumerate(self.plan.strategies) if s in kinds}
        if self.layers is not None:
            check_layers_in_range(self.layers, num_blocks)
            indices = list(self.layers)
        elif self.num_layers is not None:
            check_num_layers_in_range(self.num_layers, num_blocks)
            indices = SELECTION_METHODS[self.method or "uniform"](num_blocks, self.num_layers)
        else:
            indices = every_nth(num_blocks, self.every_n_layers)
        strategy = parse(self.strategy)
        return {i: strategy for i in indices}

    @classmethod
    def from_arguments(
        cls,
        kwargs_dict: Mapping[str, Any] | None = None,
        dict_name: str = "gradient_checkpointing_kwargs",
        **arguments: Any,
    ) -> "CheckpointConfig":
        """Build a config from the arguments of a ``gradient_checkpointing_enable``-style call.

        hf_ckpt's own options (``every_n_layers``, ``offload``, ``layers``, ...) may be given as ``arguments`` or as
        keys of ``kwargs_dict`` (as ``TrainingArguments.gradient_checkpointing_kwargs`` does); they are taken from
        a copy of the dict (the caller's dict is never modified) before the rest is validated against
        ``torch.utils.checkpoint.checkpoint``'s signature. Giving one both ways with different values is an
        error. ``None`` means "not given".
        """
        if kwargs_dict is None:
            kwargs_dict = {}
        if not isinstance(kwargs_dict, Mapping):
            raise TypeError(f"{dict_name} must be a dict or None; got {_type_name(kwargs_dict)}")
        remaining = dict(kwargs_dict)
        resolved: dict[str, Any] = {}
        for name in HF_CKPT_KEYS:
            argument = arguments.pop(name, None)
            in_dict = remaining.pop(name, None)
            if argument is not None and in_dict is not None and argument != in_dict:
                raise ValueError(
                    f"{name} was given twice with different values: {name}={argument!r} and "
                    f"{dict_name}[{name!r}]={in_dict!r}. Give it once."
                )
            value = argument if argument is not None else in_dict
            if value is not None:
                resolved[name] = value
        if arguments:
            raise TypeError(f"unexpected arguments {sorted(arguments)}; hf_ckpt accepts: {', '.join(HF_CKPT_KEYS)}")
        checkpoint_kwargs = _check_checkpoint_kwargs(remaining, dict_name)
        if resolved.get("checkpoint_fn") is not None:
            _check_checkpoint_fn(resolved["checkpoint_fn"], remaining, dict_name)
        return cls(checkpoint_kwargs=checkpoint_kwargs, **resolved)
