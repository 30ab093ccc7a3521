"""``CheckpointConfig``: what to checkpoint and how, validated when the user asks for it.

Every entry point (``hf_ckpt.enable``, the mixin, the patched ``transformers`` methods, the stock ``Trainer``)
funnels its arguments through :meth:`CheckpointConfig.from_arguments`, so bad input fails at the call that
carried it, with a message that names the argument and the values it accepts, and never three layers deep at
the first training step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ._compat import checkpoint_keyword_names

#: Keys of a checkpointing kwargs dict that hf_ckpt consumes itself; every other key goes to
#: ``torch.utils.checkpoint.checkpoint``.
HF_CKPT_KEYS = ("every_n_layers", "offload")

_EVERY_N_ACCEPTS = "a positive int (1 checkpoints every block, 2 every other block, ...)"


def _check_every_n_layers(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"every_n_layers must be {_EVERY_N_ACCEPTS}; got {value!r} of type {type(value).__name__}")
    if value < 1:
        raise ValueError(f"every_n_layers must be {_EVERY_N_ACCEPTS}; got {value!r}")
    return value


def _check_offload(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"offload must be True or False; got {value!r} of type {type(value).__name__}")
    return value


def _check_checkpoint_kwargs(kwargs: Mapping[str, Any], source: str) -> dict[str, Any]:
    accepted = checkpoint_keyword_names()
    for key in kwargs:
        if key not in accepted:
            raise TypeError(
                f"Unknown checkpoint keyword argument {key!r} in {source}. torch.utils.checkpoint.checkpoint "
                f"accepts: {', '.join(accepted)}; hf_ckpt itself accepts: {', '.join(HF_CKPT_KEYS)}."
            )
    checked = dict(kwargs)
    use_reentrant = checked.setdefault("use_reentrant", False)
    if not isinstance(use_reentrant, bool):
        raise TypeError(
            f"use_reentrant must be True or False; got {use_reentrant!r} of type {type(use_reentrant).__name__}"
        )
    return checked


@dataclass(frozen=True)
class CheckpointConfig:
    """A validated checkpointing setting.

    Attributes:
        every_n_layers: Recompute blocks ``0, n, 2n, ...``, counting only the repeated per-layer blocks in global
            order (encoder blocks, then decoder blocks). ``1`` recomputes every block.
        offload: Keep the inputs saved for the recompute in host memory (pinned) instead of on the accelerator.
            On a machine without an accelerator there is nothing to offload: plain checkpointing runs, with one
            warning.
        checkpoint_kwargs: Passed to ``torch.utils.checkpoint.checkpoint``. ``use_reentrant`` is always present
            and defaults to ``False``.
    """

    every_n_layers: int = 1
    offload: bool = False
    checkpoint_kwargs: Mapping[str, Any] = field(default_factory=lambda: {"use_reentrant": False})

    def __post_init__(self) -> None:
        _check_every_n_layers(self.every_n_layers)
        _check_offload(self.offload)
        object.__setattr__(self, "checkpoint_kwargs", _check_checkpoint_kwargs(self.checkpoint_kwargs, "checkpoint_kwargs"))

    @property
    def use_reentrant(self) -> bool:
        return bool(self.checkpoint_kwargs["use_reentrant"])

    @classmethod
    def from_arguments(
        cls,
        kwargs_dict: Mapping[str, Any] | None = None,
        *,
        every_n_layers: int | None = None,
        offload: bool | None = None,
        dict_name: str = "gradient_checkpointing_kwargs",
    ) -> "CheckpointConfig":
        """Build a config from the arguments of a ``gradient_checkpointing_enable``-style call.

        ``every_n_layers`` and ``offload`` may be given as arguments or as keys of ``kwargs_dict`` (as
        ``TrainingArguments.gradient_checkpointing_kwargs`` does); they are popped from a copy of the dict (the
        caller's dict is never modified) before the rest is validated against
        ``torch.utils.checkpoint.checkpoint``'s signature. Giving one both ways with different values is an error.
        """
        if kwargs_dict is None:
            kwargs_dict = {}
        if not isinstance(kwargs_dict, Mapping):
            raise TypeError(f"{dict_name} must be a dict or None; got {type(kwargs_dict).__name__}")
        remaining = dict(kwargs_dict)
        resolved: dict[str, Any] = {}
        for name, argument in (("every_n_layers", every_n_layers), ("offload", offload)):
            in_dict = remaining.pop(name, None)
            if argument is not None and in_dict is not None and argument != in_dict:
                raise ValueError(
                    f"{name} was given twice with different values: {name}={argument!r} and "
                    f"{dict_name}[{name!r}]={in_dict!r}. Give it once."
                )
            value = argument if argument is not None else in_dict
            if value is not None:
                resolved[name] = value
        checkpoint_kwargs = _check_checkpoint_kwargs(remaining, dict_name)
        return cls(checkpoint_kwargs=checkpoint_kwargs, **resolved)
