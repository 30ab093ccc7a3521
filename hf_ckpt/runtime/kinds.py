"""The registry of per-block strategy kinds. A block's strategy is a :class:`Strategy`; its *spelling* is the form
plans, JSON and kwargs dicts carry (``"full"``, ``"oplevel:<name>"``, ``"partition:<F>[:norms]"``), read only by
:func:`parse`. Each kind owns its arguments, its checks against a :class:`~hf_ckpt.CheckpointConfig` and its
checkpoint function (ending in the modifiers offload and ``checkpoint_fn``: ``wrap``). ``none`` and ``full`` are
defined here; the other kinds register from their folders in :mod:`hf_ckpt.strategies` when ``hf_ckpt`` is imported
(:func:`register_lazy`: the class loads when a setting first uses the kind), so the runtime never imports them."""

from __future__ import annotations

from enum import Enum
from typing import Any, Callable, ClassVar, Iterable, Mapping, Protocol


class BlockStrategy(str, Enum):
    """The block strategies without arguments.

    A ``str`` enum: members compare equal to their values, so plans and configs may carry plain strings
    (``"full"``), as JSON does.

    Attributes:
        FULL: Recompute the whole block in backward; only its inputs are kept.
        SELECTIVE: Keep the outputs of its matmuls and attention, recompute the cheap ops in between.
        NONE: No checkpointing: keep every activation.
    """

    FULL = "full"
    SELECTIVE = "selective"
    NONE = "none"

    def __str__(self) -> str:
        return self.value


NONE, FULL, SELECTIVE = BlockStrategy.NONE.value, BlockStrategy.FULL.value, BlockStrategy.SELECTIVE.value
#: The strategies without arguments, in the order the planner tries them (cheapest recompute first).
ALL_STRATEGIES: tuple[str, ...] = (NONE, SELECTIVE, FULL)
#: What ``hf_ckpt.enable(strategy=...)`` accepts: a strategy for every selected block.
WHOLE_MODEL_STRATEGIES: tuple[str, ...] = (FULL, SELECTIVE)

#: Kind -> its class (None until a kind registered with :func:`register_lazy` is first used), and the loaders.
_registered: dict[str, "type[Strategy] | None"] = {}
_loaders: dict[str, Callable[[], type["Strategy"]]] = {}


def kinds() -> tuple[str, ...]:
    """The registered kinds, in the order they registered (``none`` and ``full`` first)."""
    return tuple(_registered)

#: Builds a kind's checkpoint function from the checkpoint keyword arguments: the modifiers (offload,
#: ``checkpoint_fn``) around ``torch.utils.checkpoint.checkpoint``.
Wrap = Callable[[dict[str, Any]], Callable[..., Any]]


#: The modifiers of a kind's checkpoint function, in the order messages name them, and whether a setting turns
#: each on. A kind names those it cannot take in :attr:`Strategy.refuses`, the one table every check reads.
MODIFIERS: dict[str, Callable[["Setting"], bool]] = {
    "use_reentrant=True": lambda config: config.use_reentrant,
    "offload=True": lambda config: bool(config.offload),
    "checkpoint_fn": lambda config: config.checkpoint_fn is not None,
    "context_fn": lambda config: "context_fn" in config.checkpoint_kwargs,
}


class Setting(Protocol):
    """What a strategy reads of the :class:`~hf_ckpt.CheckpointConfig` it is checked against and built for."""

    checkpoint_kwargs: Mapping[str, Any]
    offload: bool
    checkpoint_fn: Any
    policy: Any

    @property
    def use_reentrant(self) -> bool: ...


class Strategy:
    """One block's strategy. Subclasses are the kinds; instances are immutable values.

    Attributes:
        kind: The registry key, the spelling's part before the first ``:``.
        recomputes: Whether a block with this strategy is recomputed in backward (``none``: not).
        uses_context_fn: It works through ``torch.utils.checkpoint.checkpoint``'s ``context_fn`` (torch's
            selective checkpointing), so it needs non-reentrant checkpointing and no ``context_fn`` or
            ``checkpoint_fn`` of the user's.
        saved_tensor_hook: Its blocks' outputs are made again from what they keep, by the one saved-tensor hook
            the runtime's saved-tensor hook installer installs (partitions: :func:`hf_ckpt.runtime.extensions.saved_tensor_hook`).
        takes_policy: It reads the config's ``policy`` (checked by its ``check_policy``).
        refuses: The :data:`MODIFIERS` it cannot take, read by every check (:meth:`refused`).
        names_refusals: Its :meth:`check` names all it refuses; else ``checkpoint_fn``'s check names the kind.
    """

    kind: ClassVar[str]
    recomputes: ClassVar[bool] = True
    uses_context_fn: ClassVar[bool] = False
    saved_tensor_hook: ClassVar[bool] = False
    takes_policy: ClassVar[bool] = False
    refuses: ClassVar[frozenset[str]] = frozenset()
    names_refusals: ClassVar[bool] = False

    @classmethod
    def from_argument(cls, argument: str | None, spelling: str, policies: Mapping[str, Any]) -> "Strategy":
        """The strategy spelled ``spelling`` (``argument`` is its part after ``kind:``, None without one)."""
        if argument is not None:
            raise ValueError(_unknown(spelling))
        return cls()

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this kind cannot run here (this torch), or None; the planner asks before measuring."""
        return None

    @property
    def spelling(self) -> str:
        """The form plans and JSON carry."""
        return self.kind

    def check(self, config: Setting) -> None:
        """Raise ValueError when ``config`` asks for something this strategy cannot do (at the enable call)."""

    def refused(self, config: Setting) -> list[str]:
        """The modifiers ``config`` turns on that this kind refuses (:attr:`refuses`), in :data:`MODIFIERS` order."""
        return [name for name, active in MODIFIERS.items() if name in self.refuses and active(config)]

    def context_fn(self, config: Setting) -> Callable[[], Any] | None:
        """The ``context_fn`` for ``torch.utils.checkpoint.checkpoint``, or None."""
        return None

    def checkpoint_function(self, config: Setting, checkpoint_kwargs: Mapping[str, Any],
                            wrap: Wrap) -> Callable[..., Any]:
        """The function that checkpoints a block with this strategy, ``checkpoint(function, *args, **kwargs)``."""
        kwargs = dict(checkpoint_kwargs)
        context = self.context_fn(config)
        if context is not None:
            kwargs["context_fn"] = context
        return wrap(kwargs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Strategy) and other.spelling == self.spelling

    def __hash__(self) -> int:
        return hash(self.spelling)

    def __repr__(self) -> str:
        return f"<strategy {self.spelling}>"


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: make ``cls`` the kind ``cls.kind``."""
    _registered[cls.kind] = cls
    return cls


def register_lazy(kind: str, load: Callable[[], type[Strategy]]) -> None:
    """Register ``kind``, its class (of that ``kind``) loaded by ``load()`` the first time a setting uses it."""
    _registered[kind], _loaders[kind] = None, load


def kind_of(spelling: str) -> str:
    """The kind of a spelling: ``"partition"`` for ``"partition:0.5"``."""
    return spelling.partition(":")[0]


def keeps_everything(name: str) -> bool:
    """Whether ``name`` spells a kind that recomputes nothing (``none``); False for any other name (``"outside"``)."""
    return kind_of(name) in _registered and not strategy_class(kind_of(name)).recomputes


def kind_class(spelling: str) -> type["Strategy"]:
    """The class of ``spelling``'s kind, to ask it (``kind_class(s).recomputes``) without parsing its argument."""
    return strategy_class(kind_of(spelling))


def summary_order(spellings: Iterable[str]) -> list[str]:
    """The distinct ``spellings`` as a plan's summary counts them: full, selective, the others sorted, none."""
    rank = {FULL: 0, SELECTIVE: 1, NONE: 3}
    return sorted(set(spellings), key=lambda spelling: (rank.get(spelling, 2), spelling))


def _unknown(value: Any) -> str:
    return (f"each plan strategy must be one of {', '.join(repr(s) for s in ALL_STRATEGIES)}; got {value!r} "
            "(or 'oplevel:<name>' with <name> a key of policies, or 'partition:<F>[:norms]' with F in [0, 1])")


def strategy_class(kind: str) -> type[Strategy]:
    """The class of ``kind``; ValueError for a kind nobody registered."""
    if kind not in _registered:
        raise ValueError(_unknown(kind))
    if _registered[kind] is None:
        cls = _loaders[kind]()
        if cls.kind != kind:
            raise TypeError(f"the class registered as kind {kind!r} is {cls.__name__}, of kind {cls.kind!r}")
        _registered[kind] = cls
    return _registered[kind]


def parse(value: Any, policies: Mapping[str, Any] | None = None) -> Strategy:
    """The :class:`Strategy` spelled ``value`` (a string or a :class:`BlockStrategy`), ``oplevel:<name>``
    looked up in ``policies``; ValueError listing the accepted spellings otherwise."""
    if isinstance(value, Strategy):
        return value
    if not isinstance(value, str):
        raise ValueError(_unknown(value))
    spelling = value.value if isinstance(value, BlockStrategy) else value
    kind, colon, argument = spelling.partition(":")
    if kind not in _registered:
        raise ValueError(_unknown(value))
    return strategy_class(kind).from_argument(argument if colon else None, spelling, policies or {})


@register
class NoCheckpoint(Strategy):
    """``"none"``: the block keeps every activation; nothing is recomputed."""

    kind = NONE
    recomputes = False


@register
class Full(Strategy):
    """``"full"``: the block is recomputed whole in backward; only its inputs are kept."""

    kind = FULL
