"""The ``"selective"`` kind: torch's selective checkpointing with a named policy (:mod:`hf_ckpt.strategies.selective.policy`)."""

from __future__ import annotations

from typing import Any, Callable

from hf_ckpt.strategies.selective.policy import check_policy, selective_context_fn, selective_supported
from hf_ckpt.runtime.kinds import SELECTIVE, Setting, Strategy


#: What a kind that works through torch's selective checkpoint contexts cannot take: reentrant checkpointing, a
#: ``context_fn`` of the user's (it sets its own) and a ``checkpoint_fn`` (which has no ``context_fn``).
CONTEXT_FN_REFUSES = frozenset({"use_reentrant=True", "checkpoint_fn", "context_fn"})


def check_selective_contexts(strategy: Strategy, config: Setting) -> None:
    """What every kind that works through torch's selective checkpoint contexts needs (``context_fn``). Of the
    modifiers it refuses, ``checkpoint_fn`` is named by ``checkpoint_fn``'s own check (in the config)."""
    if not selective_supported():
        raise ValueError(
            'strategy="selective" needs torch.utils.checkpoint.create_selective_checkpoint_contexts and '
            "CheckpointPolicy, which this torch lacks (torch >= 2.5 has them)"
        )
    refused = strategy.refused(config)
    if "use_reentrant=True" in refused:
        raise ValueError('strategy="selective" needs use_reentrant=False (selective recompute is non-reentrant only)')
    if "context_fn" in refused:
        raise ValueError('strategy="selective" sets context_fn itself; drop context_fn or use strategy="full"')


def respected_hooks(config: Setting) -> bool | None:
    """The user's ``respect_saved_tensors_hooks`` (torch >= 2.14), else False: torch <= 2.13's behaviour, where the
    tensors selective checkpointing saves bypass saved-tensor hooks (see :func:`hf_ckpt.strategies.selective.policy.selective_contexts`)."""
    return config.checkpoint_kwargs.get("respect_saved_tensors_hooks", False)


class Selective(Strategy):
    """``"selective"``: keep the outputs of the block's matmuls and attention (or what ``policy`` names),
    recompute the cheap ops in between. The policy is the config's (``hf_ckpt.enable(policy=...)``)."""

    kind = SELECTIVE
    uses_context_fn = True
    takes_policy = True
    refuses = CONTEXT_FN_REFUSES
    #: Checks ``hf_ckpt.enable(policy=...)``: a name, a list of aten ops, or a callable.
    check_policy = staticmethod(check_policy)

    def check(self, config: Setting) -> None:
        check_selective_contexts(self, config)

    def context_fn(self, config: Setting) -> Callable[[], Any]:
        return selective_context_fn(config.policy, respected_hooks(config))
