"""hf_ckpt inside DDP, FSDP2, FSDP1 and accelerate: the same selection, one checkpoint per block.

* :func:`apply` / :func:`remove`: hf_ckpt's selection applied through ``torch.distributed``'s
  ``checkpoint_wrapper`` (``apply_activation_checkpointing``), for training loops built on FSDP's wrapper
  mechanism. :func:`wrapped_layers` lists the blocks that checkpoint wrappers cover.
* :func:`guard` / :func:`unguard`: at every training forward, no block checkpointed twice (an engine's
  ``CheckpointWrapper`` wins over hf_ckpt's flags, with one warning), and a clear error for reentrant
  checkpointing under ``DistributedDataParallel(find_unused_parameters=True)``.

``hf_ckpt.enable`` itself works under the engines; ``docs/guides/distributed.md`` gives the order of calls each
engine needs.

The names load on first use (PEP 562). Imported with ``hf_ckpt``, the package registers its guard and the blocks
engines' wrappers cover with the runtime (:mod:`hf_ckpt.runtime.extensions`), loading them at their first call.
"""

from typing import TYPE_CHECKING, Any

from hf_ckpt.runtime import extensions
from hf_ckpt.runtime.util.lazy import lazy_exports

_EXPORTS = {"guard": ".checks", "unguard": ".checks", "apply": ".wrapper", "remove": ".wrapper",
            "wrapped_layers": ".wrapper"}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from hf_ckpt.distributed.checks import guard, unguard
    from hf_ckpt.distributed.wrapper import apply, remove, wrapped_layers

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


@extensions.register_guard
def _guard_hook(target: Any) -> Any:
    from hf_ckpt.distributed import checks  # deferred (as below): registering must not load torch
    return checks.new_hook(target)


@extensions.register_wrapped_blocks
def _wrapped_blocks(target: Any) -> Any:
    from hf_ckpt.distributed import _engines
    return _engines.wrapped_blocks(target)
