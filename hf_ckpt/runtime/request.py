"""``EnableRequest``: one enable call's arguments, parsed once and validated before the model is touched.

``hf_ckpt.enable``, the mixin, the patched methods (so the ``Trainer``) and ``hf_ckpt.distributed.apply`` parse the
user's arguments here, once; every later step (the install, a budget's planning) reads the request, never the
arguments. The setting itself is a :class:`~hf_ckpt.runtime.config.CheckpointConfig`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from hf_ckpt.runtime.config import CheckpointConfig
from hf_ckpt.runtime.util.units import parse_budget


_ABSENT = object()  # an argument the call did not give, where None and False are values


@dataclass(frozen=True, eq=False)
class EnableRequest:
    """One enable call (``hf_ckpt.enable``, the mixin, the patched methods, so the ``Trainer``), parsed once
    (:meth:`parse`) and validated at construction: a bad argument fails here, naming the values it accepts, before
    the model is touched. Every entry point hands it on; no other code reads the user's arguments.

    Attributes:
        options: hf_ckpt's options the call gave as arguments; a name it did not give is absent.
        kwargs_dict: The call's kwargs dict (a copy, ``budget`` and ``keep_outputs`` taken out): checkpoint keyword
            arguments, and hf_ckpt's options given there.
        dict_name: The dict's name, for messages.
        budget: None: no budget. Without ``sample_inputs``: ``"auto"``, a fraction (float) or bytes (int); with
            them, the planner's budget (no ``"auto"``).
        sample_inputs: The batch a budget is profiled on now; None: planned at the first training batch.
        keep_outputs: For a budget planned at the first batch: plan for a loop that keeps the outputs.
        config: The setting made from all this (a budget's plan is not in it yet: :meth:`config_with`).
    """

    options: Mapping[str, Any] = field(default_factory=dict)
    kwargs_dict: Mapping[str, Any] | None = None
    dict_name: str = "checkpoint_kwargs"
    budget: float | int | str | None = None
    sample_inputs: Mapping[str, Any] | None = None
    keep_outputs: bool = False
    config: CheckpointConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        deferred = self.budget is not None and self.sample_inputs is None
        if self.keep_outputs is not False and not deferred:
            raise ValueError("keep_outputs chooses the loop a budget without sample_inputs is planned for: give budget "
                             "without sample_inputs, or drop keep_outputs")
        if self.budget is None and self.sample_inputs is not None:
            raise ValueError("sample_inputs is the batch a budget is profiled on: give budget too, or drop sample_inputs")
        if self.budget is not None and self.options.get("plan") is not None:
            raise ValueError("give either plan or budget (which makes a plan), not both")
        if self.budget is not None:
            object.__setattr__(self, "budget", parse_budget(self.budget, with_auto=deferred))
        if deferred and not isinstance(self.keep_outputs, bool):
            raise ValueError(f"keep_outputs must be True or False; got {self.keep_outputs!r}")
        config = CheckpointConfig.from_arguments(self.kwargs_dict, dict_name=self.dict_name, **self.options)
        object.__setattr__(self, "config", config)  # the one place the arguments are read
        if deferred:
            _check_budget_alone(self.config)

    @classmethod
    def parse(cls, kwargs_dict: Mapping[str, Any] | None, dict_name: str, *, takes_budget: bool = True,
              **arguments: Any) -> "EnableRequest":
        """The request of a ``gradient_checkpointing_enable``-style call: hf_ckpt's options as ``arguments`` (None:
        not given) or as keys of ``kwargs_dict`` (named ``dict_name`` in errors; the caller's dict is never
        modified), the rest for ``torch.utils.checkpoint.checkpoint``. ``takes_budget=False``: a call that takes no
        budget (``hf_ckpt.distributed.apply``), where ``budget`` is an unknown keyword as any other."""
        remaining = dict(kwargs_dict) if isinstance(kwargs_dict, Mapping) else kwargs_dict
        if not takes_budget:
            return cls(arguments, remaining, dict_name)
        budget = _given_once(arguments.pop("budget", None), remaining)
        keep_outputs = _keep_outputs(arguments.pop("keep_outputs", _ABSENT), remaining)
        sample_inputs = arguments.pop("sample_inputs", None)
        options = {name: value for name, value in arguments.items() if value is not None}
        return cls(options, remaining, dict_name, budget, sample_inputs, keep_outputs)

    @classmethod
    def of(cls, **options: Any) -> "EnableRequest":
        """The request of ``hf_ckpt.enable(model, **options)``: how the lab (the bench, the planners' profiling, the
        estimate's check) sets a model up, through the same door as users."""
        return cls.parse(None, "checkpoint_kwargs", **options)

    def config_with(self, **changes: Any) -> CheckpointConfig:
        """The parsed config with ``changes`` to its fields (``plan=``: a budget's plan), checked again as a whole;
        the arguments are not read again."""
        return dataclasses.replace(self.config, **changes)


def _given_once(argument: Any, kwargs_dict: dict[str, Any] | None) -> Any:
    """``budget`` as an argument or in the dict (taken out of it); given both ways, the two must be equal."""
    in_dict = kwargs_dict.pop("budget", None) if isinstance(kwargs_dict, dict) else None
    if argument is not None and in_dict is not None and argument != in_dict:
        raise ValueError(f"budget was given twice with different values: budget={argument!r} and {in_dict!r} in the dict. Give it once.")
    return argument if argument is not None else in_dict


def _keep_outputs(argument: Any, kwargs_dict: dict[str, Any] | None) -> Any:
    """``keep_outputs`` as an argument or in the dict (taken out of it); False when given neither way. Given both
    ways as True or False, the two must be the same; a value of another type is returned, for the request to name."""
    in_dict = kwargs_dict.pop("keep_outputs", _ABSENT) if isinstance(kwargs_dict, dict) else _ABSENT
    given = [value for value in (argument, in_dict) if value is not _ABSENT]
    bad = [value for value in given if not isinstance(value, bool)]
    if len(given) == 2 and not bad and given[0] is not given[1]:
        raise ValueError("keep_outputs was given twice with different values, as an argument and in the dict. Give it once.")
    return bad[0] if bad else (given[0] if given else False)


def _check_budget_alone(config: CheckpointConfig) -> None:
    """A budget makes the plan itself: no other way of choosing the blocks beside it."""
    chosen = [name for name, active in (
        ("every_n_layers", config.every_n_layers != 1), ("layers", config.layers is not None),
        ("num_layers", config.num_layers is not None), ("plan", config.plan is not None),
        ("strategy", config.strategy != CheckpointConfig.strategy),
    ) if active]
    if chosen:
        raise ValueError(f"budget makes the plan itself: give it without {', '.join(chosen)}")
