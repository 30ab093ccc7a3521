"""``GradientCheckpointingMixin``: hf_ckpt's checkpointing as the model's own methods.

Mix it in front of any ``PreTrainedModel`` subclass::

    class MyLlama(GradientCheckpointingMixin, LlamaForCausalLM):
        pass

and ``gradient_checkpointing_enable`` (and, on transformers >= 5.23, ``activation_checkpointing_enable``) accept
``every_n_layers``, ``offload`` and every other hf_ckpt option as arguments or as keys of the kwargs dict, on every
supported release.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from hf_ckpt.runtime.apply import remove
from hf_ckpt.runtime.util.compat import has_activation_checkpointing_names
from hf_ckpt.core import configure


def _enable(model: Any, kwargs_dict: dict[str, Any] | None, dict_name: str, **options: Any) -> None:
    configure(model, kwargs_dict, dict_name, **options)  # the one enable path (a budget included)


def _deprecated(old: str, new: str) -> None:
    """Upstream's ``FutureWarning`` for a deprecated name, attributed as upstream's is: to
    ``transformers.modeling_utils``, so ``-W error::FutureWarning:transformers`` treats both alike."""
    message = f"`{old}` is deprecated and will be removed in v6. Use `{new}` instead."
    modeling_utils = sys.modules.get("transformers.modeling_utils")
    if modeling_utils is None:
        warnings.warn(message, FutureWarning, stacklevel=3)
        return
    upstream = getattr(getattr(modeling_utils, "PreTrainedModel", None), "__dict__", {}).get(old)
    code = getattr(upstream, "__code__", None)
    warnings.warn_explicit(
        message,
        FutureWarning,
        filename=modeling_utils.__file__,
        lineno=code.co_firstlineno if code is not None else 0,
        module=modeling_utils.__name__,
        registry=modeling_utils.__dict__.setdefault("__warningregistry__", {}),
    )


def _overridden(model: Any, name: str) -> bool:
    """Upstream's test (transformers >= 5.23): a subclass override or a wrapper set on the instance is not this
    class's own function (TRL wraps the instance's ``gradient_checkpointing_enable`` to add its options)."""
    return getattr(getattr(model, name), "__func__", None) is not GradientCheckpointingMixin.__dict__[name]


def _given(**options: Any) -> dict[str, Any]:
    return {name: value for name, value in options.items() if value is not None}


class GradientCheckpointingMixin:
    """Correct ``every_n_layers``, ``offload`` and checkpoint kwargs for a ``PreTrainedModel`` subclass.

    Put it first among the bases. The methods keep upstream's names and signatures, so the stock ``Trainer``,
    TRL and PEFT call them as they call upstream's. On transformers >= 5.23, where upstream renamed the methods
    to ``activation_checkpointing_*`` and kept the old names as deprecated aliases, the mixin provides both, with
    upstream's routing: the old names warn with upstream's ``FutureWarning``; ``activation_checkpointing_*`` hand
    off to ``gradient_checkpointing_*`` when a subclass overrides those or a wrapper sits on the instance (as
    TRL's does), and the old names hand off to an overriding ``activation_checkpointing_*``. No path recurses.
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
                ``method``, ``strategy``, ``policy``, ``plan``, ``budget``, ``keep_outputs``, ``head_chunk_size``,
                ``mlp_chunk_size``), which are taken out before the rest is passed on. ``budget`` (``"40GiB"``, ``0.5``, ``"50%"``,
                ``"auto"``) plans from the first training batch's shapes, for the ``Trainer``'s step or, with
                ``keep_outputs=True``, for a loop that keeps the outputs through backward (see
                :func:`hf_ckpt.enable`).
            every_n_layers: Recompute blocks ``0, n, 2n, ...``; default 1 (every block).
            offload: Keep the inputs saved for the recompute in pinned host memory; default False.
            **options: hf_ckpt's other options, as keywords (``layers=[0, 3]``, ``strategy="selective"``, ...).
        """
        if not has_activation_checkpointing_names():
            _enable(self, gradient_checkpointing_kwargs, "gradient_checkpointing_kwargs",
                    every_n_layers=every_n_layers, offload=offload, **options)
            return
        _deprecated("gradient_checkpointing_enable", "activation_checkpointing_enable")
        if _overridden(self, "gradient_checkpointing_enable"):  # reached from the override itself
            _enable(self, gradient_checkpointing_kwargs, "gradient_checkpointing_kwargs",
                    every_n_layers=every_n_layers, offload=offload, **options)
        else:
            self.activation_checkpointing_enable(
                gradient_checkpointing_kwargs, **_given(every_n_layers=every_n_layers, offload=offload), **options
            )

    def gradient_checkpointing_disable(self) -> None:
        """Disable activation checkpointing and undo everything the enable call added."""
        if not has_activation_checkpointing_names():
            remove(self)
            return
        _deprecated("gradient_checkpointing_disable", "activation_checkpointing_disable")
        if _overridden(self, "gradient_checkpointing_disable"):
            remove(self)
        else:
            self.activation_checkpointing_disable()

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
        if _overridden(self, "gradient_checkpointing_enable"):  # subclasses and wrappers stay the entry point
            self.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs=activation_checkpointing_kwargs,
                **_given(every_n_layers=every_n_layers, offload=offload),
                **options,
            )
            return
        _enable(self, activation_checkpointing_kwargs, "activation_checkpointing_kwargs",
                every_n_layers=every_n_layers, offload=offload, **options)

    def activation_checkpointing_disable(self) -> None:
        """Disable activation checkpointing and undo everything the enable call added."""
        if _overridden(self, "gradient_checkpointing_disable"):
            self.gradient_checkpointing_disable()
            return
        remove(self)


if not has_activation_checkpointing_names():
    # Before transformers 5.23 the new names do not exist upstream; the mixin does not invent them.
    del GradientCheckpointingMixin.activation_checkpointing_enable
    del GradientCheckpointingMixin.activation_checkpointing_disable
