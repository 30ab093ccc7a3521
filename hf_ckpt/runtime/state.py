"""The one record of what hf_ckpt changed on a model, and how to take it back exactly.

Whoever applies checkpointing (``hf_ckpt.enable``, the mixin, the patched ``transformers`` methods,
``hf_ckpt.distributed.apply``) leaves a :class:`CheckpointState` in the target model's ``__dict__``. It holds:

* ``before``: the model's checkpointing attributes as they were before hf_ckpt first touched them (upstream's
  flags and functions included), so that ``disable`` puts back exactly that;
* ``bound``: the attribute values hf_ckpt set, so that a change made behind its back (upstream's
  ``gradient_checkpointing_disable`` after ``unpatch_transformers``) is noticed: such a record is *stale*; one
  warning names what changed and the record is dropped, hooks and all, at the next look outside a forward
  (:func:`get_state`). What hf_ckpt itself changes for one forward (the stacks' flags, off under ``no_grad``) is
  *lent* (:meth:`CheckpointState.lend`) and never makes the record stale; hooks read the record with
  :func:`peek_state`, which never drops it;
* ``hooks``: every hook hf_ckpt added, removable and re-installable (:class:`Hooks`);
* ``undo``: further actions that take back what was done (switching ``distributed.apply``'s wrappers off);
* ``measured``: the blocks that the first training step actually recomputed, once known;
* ``source``: which entry point made it (:class:`Source`);
* ``budget``: a budget planned from the first training batch (:class:`PlannedBudget`, made by
  :mod:`hf_ckpt.budget.deferred`). Until that batch the record binds nothing and holds only the hook that will
  plan; after it, the plan is bound as any other setting.

One function makes the record and installs its hooks: :func:`hf_ckpt.runtime.apply.install`.

Profiling (the planner) runs inside :func:`suspended`, which takes the record and every hook off the model and
puts them back, with the attributes, exactly as they were.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

from torch import nn
from torch.utils.hooks import RemovableHandle

from hf_ckpt.runtime.blocks import SELECTED_ATTRIBUTE
from hf_ckpt.runtime.util.warn import warn_once

if TYPE_CHECKING:
    from hf_ckpt.runtime.config import CheckpointConfig

#: Set (in ``__dict__``) on hf_ckpt's own checkpoint wrappers (``hf_ckpt.distributed.apply``): True while the
#: wrapper checkpoints its block.
ACTIVE_ATTRIBUTE = "hf_ckpt_active"
#: The instance attributes hf_ckpt may set on a model's modules.
TRACKED_ATTRIBUTES = ("gradient_checkpointing", "_gradient_checkpointing_func", SELECTED_ATTRIBUTE, ACTIVE_ATTRIBUTE)
STATE_ATTRIBUTE = "_hf_ckpt_state"
_MISSING = object()


class Source(enum.Enum):
    """Which entry point made a record: its value is the name a message gives it (``hf_ckpt.<value>(...)``)."""

    ENABLE = "enable"
    DISTRIBUTED = "distributed.apply"
    BUDGET = "budget"


class PlannedBudget(Protocol):
    """What the runtime (the record, the ``Trainer``'s callback) knows of a budget planned at the first training
    batch (:class:`hf_ckpt.budget.record.DeferredBudget`), without loading the lab."""

    keep_outputs: bool

    def use_optimizer(self, optimizer: Any) -> None:
        """Leave room for ``optimizer``'s first-step state in ``"auto"``."""

    def save_in(self, output_dir: str | os.PathLike | None) -> None:
        """Save the plan in ``output_dir`` (now, if it is made already, and at every re-plan)."""


@dataclass
class AttributeSnapshot:
    """The tracked attributes of every module of a model, as instance attributes (absent ones included)."""

    entries: list[tuple[nn.Module, str, Any]]

    @classmethod
    def take(cls, model: nn.Module) -> "AttributeSnapshot":
        return cls(
            [(m, name, m.__dict__.get(name, _MISSING)) for m in model.modules() for name in TRACKED_ATTRIBUTES]
        )

    def restore(self) -> None:
        for module, name, value in self.entries:
            if value is not _MISSING:
                setattr(module, name, value)
            elif name in module.__dict__:
                delattr(module, name)


@dataclass
class _Hook:
    module: nn.Module
    register: str
    function: Callable[..., Any]
    options: dict[str, Any]
    group: str
    handle: RemovableHandle | None = None
    registered: _WhileRegistered | None = None


class _WhileRegistered:
    """Registered for a hook: calls it until removed. A forward runs the hooks it began with, even one an earlier
    hook removed (a stale record dropped, a budget planned), a ``with_kwargs`` pre-hook then without its kwargs."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.__wrapped__, self.removed = function, False

    def __call__(self, *args: Any) -> Any:
        return None if self.removed else self.__wrapped__(*args)


class Hooks:
    """Hooks hf_ckpt added to a model: each can be removed and installed again (the planner's suspension)."""

    def __init__(self) -> None:
        self._hooks: list[_Hook] = []

    def add(
        self, module: nn.Module, register: str, function: Callable[..., Any], *, group: str = "", **options: Any
    ) -> None:
        """Register ``function`` with ``module.<register>(function, **options)`` and keep it, under ``group``."""
        self._hooks.append(_Hook(module, register, function, options, group))
        self.install(self._hooks[-1:])

    def remove(self, group: str | None = None) -> None:
        for hook in self._hooks:
            if hook.handle is not None and group in (None, hook.group):
                hook.handle.remove()
                hook.registered.removed = True
                hook.handle = hook.registered = None

    def install(self, hooks: list[_Hook] | None = None) -> None:
        for hook in self._hooks if hooks is None else hooks:
            if hook.handle is None:
                hook.registered = _WhileRegistered(hook.function)
                hook.handle = getattr(hook.module, hook.register)(hook.registered, **hook.options)

    def discard(self, group: str) -> None:
        """Remove and forget the hooks of ``group`` (a one-shot probe that finished)."""
        self.remove(group)
        self._hooks = [h for h in self._hooks if h.group != group]

    def registered(self, module: nn.Module, register: str) -> list[tuple[Callable[..., Any], dict[str, Any]]]:
        """The ``(function, options)`` of the installed hooks registered on ``module`` with ``register``."""
        return [(h.function, h.options) for h in self._hooks if h.module is module and h.register == register
                and h.handle is not None]

    def __len__(self) -> int:
        return len(self._hooks)


@dataclass
class CheckpointState:
    """What hf_ckpt changed on one model (see the module docstring)."""

    config: "CheckpointConfig"
    before: AttributeSnapshot
    bound: list[tuple[nn.Module, str, Any]]
    source: Source = Source.ENABLE
    hooks: Hooks = field(default_factory=Hooks)
    undo: list[Callable[[], None]] = field(default_factory=list)
    measured: tuple[int, ...] | None = None
    budget: PlannedBudget | None = None  # a budget planned at the first batch, pending or planned
    #: How many forwards have each module's ``gradient_checkpointing`` flag lent (off for a ``no_grad`` forward).
    lent: collections.Counter = field(default_factory=collections.Counter)

    def is_current(self) -> bool:
        """Whether every attribute hf_ckpt set still holds the value it set (a lent flag counts as held)."""
        return self.changed() is None

    def changed(self) -> str | None:
        """What changed behind hf_ckpt's back, in words (the first attribute that no longer holds the value hf_ckpt
        set, and what it holds now), or None when nothing did."""
        for module, name, value in self.bound:
            now = module.__dict__.get(name, _MISSING)
            if now is value or (name == "gradient_checkpointing" and now is False and self.lent[id(module)]):
                continue
            shown = "absent" if now is _MISSING else repr(now) if not callable(now) else "another function"
            return f"{type(module).__name__}.{name} is {shown}, hf_ckpt set {value!r}" if not callable(value) else \
                f"{type(module).__name__}.{name} is {shown}, not the function hf_ckpt set"
        return None

    def lend(self, modules: tuple[nn.Module, ...]) -> None:
        """Until :meth:`take_back_lent`, the ``gradient_checkpointing`` flags of ``modules`` may be False without
        making the record stale (hf_ckpt turns them off itself for one forward)."""
        self.lent.update(id(m) for m in modules)

    def take_back_lent(self, modules: tuple[nn.Module, ...]) -> None:
        """End one :meth:`lend` of ``modules``."""
        self.lent.subtract(id(m) for m in modules)

    def record(self, module: nn.Module, name: str, value: Any) -> None:
        """Set ``module.<name> = value`` on hf_ckpt's behalf, keeping the record current."""
        setattr(module, name, value)
        self.bound = [(m, n, v) for m, n, v in self.bound if not (m is module and n == name)]
        self.bound.append((module, name, value))

    def detach(self) -> None:
        """Remove hf_ckpt's hooks and run the undo actions (attributes are the caller's business)."""
        self.hooks.remove()
        for action in reversed(self.undo):
            action()
        self.undo.clear()


def get_state(target: nn.Module, *, warn: bool = True) -> CheckpointState | None:
    """hf_ckpt's record on ``target``; None when there is none, or when it went stale: then one warning says what
    changed (:func:`warn_stale`; ``warn=False`` where the caller replaces or removes the setting anyway) and the
    record is dropped, hooks and all. Not for hooks: a forward reads the record with :func:`peek_state`."""
    state = target.__dict__.get(STATE_ATTRIBUTE)
    if state is not None and not state.is_current():
        if warn:
            warn_stale(target, state)
        clear_state(target)
        return None
    return state


def peek_state(target: nn.Module) -> CheckpointState | None:
    """hf_ckpt's record on ``target`` as it is, current or stale, never dropped: what hooks read inside a forward
    (dropping a record there would take its hooks off halfway through the forward)."""
    return target.__dict__.get(STATE_ATTRIBUTE)


def warn_stale(target: nn.Module, state: CheckpointState) -> None:
    """Warn once per record that its setting was changed behind hf_ckpt's back, naming what changed."""
    warn_once(
        f"hf_ckpt's setting on {type(target).__name__} ({state.config.describe()}) was changed outside hf_ckpt "
        f"({state.changed()}: upstream's gradient_checkpointing_enable/disable, or an assignment): hf_ckpt drops its "
        "setting and hooks and leaves the model as it is now. Call hf_ckpt.enable(...) again to put the setting "
        "back, or hf_ckpt.disable(...) to turn checkpointing off.",
        key=f"stale-record:{id(state)}", owner=target)


def set_state(target: nn.Module, state: CheckpointState) -> None:
    target.__dict__[STATE_ATTRIBUTE] = state


def clear_state(target: nn.Module) -> CheckpointState | None:
    """Take the record off ``target`` and detach it (hooks removed, undo run); the attributes stay as they are."""
    state = target.__dict__.pop(STATE_ATTRIBUTE, None)
    if state is not None:
        state.detach()
    return state


def take_back(target: nn.Module) -> AttributeSnapshot:
    """Undo hf_ckpt's current setting on ``target``; returns the attributes the model had before hf_ckpt.

    Without a (current) record, nothing changes and the model's attributes as they are now are returned (a stale
    record is dropped without a warning: the caller replaces or removes the setting).
    """
    state = get_state(target, warn=False)
    if state is None:
        return AttributeSnapshot.take(target)
    clear_state(target)
    state.before.restore()
    return state.before


@contextlib.contextmanager
def suspended(target: nn.Module) -> Iterator[None]:
    """Run the body with hf_ckpt's record and hooks off ``target``, then put everything back as it was.

    The checkpointing attributes of every module (hf_ckpt's or upstream's), the record and its hooks are
    restored exactly, whatever the body did to them.
    """
    state = get_state(target)
    snapshot = AttributeSnapshot.take(target)
    if state is not None:
        del target.__dict__[STATE_ATTRIBUTE]
        state.hooks.remove()
    try:
        yield
    finally:
        leftover = target.__dict__.pop(STATE_ATTRIBUTE, None)
        if leftover is not None and leftover is not state:
            leftover.detach()
        snapshot.restore()
        if state is not None:
            state.hooks.install()
            target.__dict__[STATE_ATTRIBUTE] = state
