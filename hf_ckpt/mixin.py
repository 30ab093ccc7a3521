"""``GradientCheckpointingMixin``: hf_ckpt's checkpointing as the model's own methods.

Mix it in front of any ``PreTrainedModel`` subclass::

    class MyLlama(GradientCheckpointingMixin, LlamaForCausalLM):
        pass

and ``gradient_checkpointing_enable`` (and, on transformers >= 5.23, ``activation_checkpointing_enable``) accept
``every_n_layers`` and ``offload`` as arguments or as keys of the kwargs dict, on every supported release.
"""

from __future__ import annotations

import warnings
from typing import Any

from ._compat import has_activation_checkpointing_names
from .config import CheckpointConfig
from .core import apply_config, remove


def _enable(model: Any, kwargs_dict: dict[str, Any] | None, dict_name: str, **options: Any) -> None:
    config = CheckpointConfig.from_arguments(kwargs_dict, dict_name=dict_name, **options)
    apply_config(model, config)


def _overridden(model: Any, name: str) -> bool:
    """Whether ``model.<name>`` is not hf_ckpt's method: a subclass override or a wrapper set on the instance (TRL's
    selective-checkpointing wrapper). Upstream's ``_is_overridden`` test (transformers >= 5.23), against the mixin."""
    return getattr(getattr(model, name), "__func__", None) is not GradientCheckpointingMixin.__dict__[name]


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"`{old}` is deprecated and will be removed in v6. Use `{new}` instead.", FutureWarning, stacklevel=3)


class GradientCheckpointingMixin:
    """Correct ``every_n_layers``, ``offload`` and checkpoint kwargs for a ``PreTrainedModel`` subclass.

    Put it first among the bases. The methods keep upstream's names and signatures, so the stock ``Trainer``,
    TRL and PEFT call them as they call upstream's. On transformers >= 5.23, where upstream renamed the methods
    to ``activation_checkpointing_*`` and kept the old names as deprecated aliases, the mixin provides both: the
    new names are the implementation and the old names warn with the same ``FutureWarning`` as upstream before
    delegating. The mixin never calls a deprecated name itself, and neither name calls back into upstream's,
    so there is no recursion.
    """

    def gradient_checkpointing_enable(
        self,
        gradient_checkpointing_kwargs: dict[str, Any] | None = None,
        every_n_layers: int | None = None,
        offload: bool | None = None,
        **options: Any,
    ) -> None:
        """Enable activation checkpointing (see :func:`hf_ckpt.enable` for every option).

        Args:
            gradient_checkpointing_kwargs: Keyword arguments for ``torch.utils.checkpoint.checkpoint``; may also
                hold hf_ckpt's own options (``every_n_layers``, ``offload``, ``layers``, ``num_layers``,
                ``method``, ``strategy``, ``policy``, ``plan``), which are taken out before the rest is passed on.
            every_n_layers: Recompute blocks ``0, n, 2n, ...``; default 1 (every block).
            offload: Keep the inputs saved for the recompute in pinned host memory; default False.
            **options: hf_ckpt's other options, as keywords (``layers=[0, 3]``, ``strategy="selective"``, ...).
        """
        if has_activation_checkpointing_names():
            _deprecated("gradient_checkpointing_enable", "activation_checkpointing_enable")
            if not _overridden(self, "gradient_checkpointing_enable") and _overridden(
                self, "activation_checkpointing_enable"
            ):
                # As upstream: not reached from an override of this name, so an override of the new name runs.
                given = {"every_n_layers": every_n_layers, "offload": offload, **options}
                self.activation_checkpointing_enable(
                    activation_checkpointing_kwargs=gradient_checkpointing_kwargs,
                    **{name: value for name, value in given.items() if value is not None},
                )
                return
        _enable(
            self, gradient_checkpointing_kwargs, "gradient_checkpointing_kwargs",
            every_n_layers=every_n_layers, offload=offload, **options,
        )

    def gradient_checkpointing_disable(self) -> None:
        """Disable activation checkpointing and undo everything the enable call added."""
        if has_activation_checkpointing_names():
            _deprecated("gradient_checkpointing_disable", "activation_checkpointing_disable")
            if not _overridden(self, "gradient_checkpointing_disable") and _overridden(
                self, "activation_checkpointing_disable"
            ):
                self.activation_checkpointing_disable()
                return
        remove(self)

    if has_activation_checkpointing_names():

        def activation_checkpointing_enable(
            self,
            activation_checkpointing_kwargs: dict[str, Any] | None = None,
            every_n_layers: int | None = None,
            offload: bool | None = None,
            **options: Any,
        ) -> None:
            """Enable activation checkpointing (see :func:`hf_ckpt.enable` for every option).

            Args:
                activation_checkpointing_kwargs: Keyword arguments for ``torch.utils.checkpoint.checkpoint``; may
                    also hold hf_ckpt's own options (``every_n_layers``, ``offload``, ``layers``, ``num_layers``,
                    ``method``, ``strategy``, ``policy``, ``plan``), taken out before the rest is passed on.
                every_n_layers: Recompute blocks ``0, n, 2n, ...``; default 1 (every block).
                offload: Keep the inputs saved for the recompute in pinned host memory; default False.
                **options: hf_ckpt's other options, as keywords (``layers=[0, 3]``, ``strategy="selective"``, ...).
            """
            if _overridden(self, "gradient_checkpointing_enable"):
                # As upstream: an override or instance wrapper of the old name stays the entry point (TRL adds its
                # {"selective": True} there); it reaches the implementation through the mixin's old name.
                given = {"every_n_layers": every_n_layers, "offload": offload, **options}
                self.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs=activation_checkpointing_kwargs,
                    **{name: value for name, value in given.items() if value is not None},
                )
                return
            _enable(
                self, activation_checkpointing_kwargs, "activation_checkpointing_kwargs",
                every_n_layers=every_n_layers, offload=offload, **options,
            )

        def activation_checkpointing_disable(self) -> None:
            """Disable activation checkpointing and undo everything the enable call added."""
            if _overridden(self, "gradient_checkpointing_disable"):
                self.gradient_checkpointing_disable()  # as upstream: the override stays the entry point
                return
            remove(self)
