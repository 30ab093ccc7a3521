"""The record of a budget planned at the first training batch (:class:`DeferredBudget`), and what it tells the user:
the plan file in the ``Trainer``'s ``output_dir`` and the one log line per plan. :mod:`hf_ckpt.budget.deferred` plans
it; :mod:`hf_ckpt.budget.from_estimate` makes each plan."""

from __future__ import annotations

import logging
import os
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hf_ckpt.budget import forms as _budget
from hf_ckpt.runtime.config import CheckpointConfig
from hf_ckpt.runtime.request import EnableRequest
from hf_ckpt.runtime.util.dtype_names import DTYPE_NAMES
from hf_ckpt.runtime.util.units import format_bytes
from hf_ckpt.strategies import summary_order

logger = logging.getLogger("hf_ckpt")

#: The plan's file name in the Trainer's ``output_dir``.
PLAN_FILE = "hf_ckpt_plan.json"
_ESTIMATE_DTYPES = tuple(getattr(torch, name) for name in DTYPE_NAMES)


@dataclass(eq=False)
class DeferredBudget:
    """A budget planned at the first training batch, and what it planned (see :mod:`hf_ckpt.budget.deferred`).

    Attributes:
        request: The enable call (:class:`~hf_ckpt.runtime.request.EnableRequest`): the budget, hf_ckpt's other
            options and the checkpoint keyword arguments, as parsed.
        budget: ``"auto"``, a fraction (float) or bytes (int): the request's.
        output_dir: Where the plan JSON is saved (the Trainer's ``output_dir``); None: not saved.
        shape: ``(batch, seq)`` the current plan was made for; None until the first batch.
        autocast: The autocast dtype the current plan was made for (mixed precision), or None.
        weights: The parameters' dtype and device, read at the first training forward and again when they moved
            (``model.to(...)``): the plan is then made again, and ``"auto"`` read from the new device.
        optimizer: A weak reference to the optimizer that will step the model (told by the ``Trainer``'s
            :class:`~hf_ckpt.integrations.trainer.BudgetPlanCallback`), whose first-step state ``"auto"`` leaves
            room for; None: AdamW's states are assumed.
        plan: The plan in effect; None until the first batch.
        auto_bytes: ``"auto"`` resolved to activation bytes at the first batch.
        plan_path: Where the plan was last saved.
        keep_outputs: Plan for a loop that keeps the model's outputs alive through backward
            (:func:`hf_ckpt.estimation.estimate`'s ``keep_outputs``); False: the ``Trainer``'s step.
    """

    request: EnableRequest
    budget: float | int | str
    output_dir: str | None = None
    shape: tuple[int, int] | None = None
    autocast: torch.dtype | None = None
    weights: ModelWeights | None = None
    optimizer: Any = None
    plan: Any = None
    auto_bytes: int | None = None
    plan_path: str | None = None
    keep_outputs: bool = False

    def same_request(self, other: "DeferredBudget") -> bool:
        """The same budget and the same configuration: options are compared as the configuration they make, so
        ``every_n_layers=1, offload=False`` (the ``Trainer``'s) and none at all (TRL's re-enable) are one request."""
        return (self.budget == other.budget and self.keep_outputs == other.keep_outputs
                and self.request.config == other.request.config)

    def use_optimizer(self, optimizer: Any) -> None:
        """Leave room for ``optimizer``'s first-step state in ``"auto"`` (the Trainer's callback tells it)."""
        if optimizer is not None:
            self.optimizer = weakref.ref(optimizer)

    def save_in(self, output_dir: str | os.PathLike | None) -> None:
        """Save the plan in ``output_dir`` (now, if it is made already, and at every re-plan)."""
        self.output_dir = os.fspath(output_dir) if output_dir is not None else None
        save_plan(self)

    def config(self, plan: Any = None) -> CheckpointConfig:
        """The request's config with ``plan``; without one, the request's config."""
        return self.request.config if plan is None else self.request.config_with(plan=plan)


@dataclass(frozen=True)
class ModelWeights:
    """The dtype most of a model's floating-point parameters have (one the estimator models, float32 otherwise) and
    their device, with one parameter to notice a move by."""

    dtype: torch.dtype
    device: torch.device
    probe: Any = None  # a weak reference to the first floating-point parameter
    seen: tuple = ()  # its dtype and device when read

    @classmethod
    def read(cls, target: nn.Module) -> "ModelWeights":
        sizes: Counter = Counter()
        first = None
        for parameter in target.parameters():
            if parameter.is_floating_point():
                sizes[parameter.dtype] += parameter.numel()
                first = first if first is not None else parameter
        dtype = sizes.most_common(1)[0][0] if sizes else torch.float32
        return cls(dtype if dtype in _ESTIMATE_DTYPES else torch.float32,
                   first.device if first is not None else torch.device("cpu"),
                   weakref.ref(first) if first is not None else None,
                   (first.dtype, first.device) if first is not None else ())

    def moved(self) -> bool:
        """Whether the parameter looked at changed dtype or device, or is gone (replaced): then read again."""
        if self.probe is None:
            return False
        first = self.probe()
        return first is None or (first.dtype, first.device) != self.seen

    def describe(self) -> str:
        return f"{str(self.dtype).removeprefix('torch.')} on {self.device}"


def _summary(plan: Any) -> str:
    counts = Counter(plan.strategies)
    return ", ".join(f"{counts[s]} {s}" for s in summary_order(plan.strategies))


def log_plan(request: DeferredBudget, where: str, replanned: str) -> None:
    plan = request.plan
    saved = save_plan(request)
    budget = _budget.describe(request.budget)
    if request.auto_bytes is not None:
        budget += f" ({format_bytes(request.auto_bytes)} for activations)"
    logger.info(
        "%sbudget %s for %s: plan %s; predicted activation memory %s of %s without checkpointing%s",
        replanned,
        budget, where, _summary(plan), format_bytes(plan.predicted_bytes), format_bytes(plan.baseline_bytes),
        f"; saved to {saved}" if saved else "",
    )


def save_plan(request: DeferredBudget) -> str | None:
    """Write the plan in effect to ``output_dir``/:data:`PLAN_FILE`; its path, or None when there is no
    plan or no ``output_dir``."""
    if request.plan is None or not request.output_dir:
        return None
    os.makedirs(request.output_dir, exist_ok=True)
    path = os.path.join(request.output_dir, PLAN_FILE)
    request.plan.save(path)
    request.plan_path = path
    return path
