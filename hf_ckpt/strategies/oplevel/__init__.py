"""The ``"oplevel:<name>"`` kind: op-level activation budgets in eager mode, which op outputs each block keeps.
``spec`` is the registered kind, ``policy`` its runtime (:class:`OpPolicy`, applied through torch's selective
checkpoint contexts), ``ops`` the op records (:class:`BlockOpProfile`); the planner that chooses them is
:mod:`hf_ckpt.planning.menus.oplevel` (``hf_ckpt.plan(..., strategies=(..., "oplevel"))``), from the op sets of
:mod:`hf_ckpt.planning.menus.frontier`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hf_ckpt.runtime.kinds import Strategy, register_lazy
from hf_ckpt.runtime.util.lazy import lazy_exports

#: Public name -> the module that defines it, loaded on first use (PEP 562).
_EXPORTS = {
    "OpPolicy": ".policy",
    "op_key": ".policy",
    "BlockOpProfile": ".ops.profile",
    "OpRecord": ".ops.profile",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and the API docs: the same names, imported eagerly
    from hf_ckpt.strategies.oplevel.policy import OpPolicy, op_key
    from hf_ckpt.strategies.oplevel.ops.profile import BlockOpProfile, OpRecord

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


def _kind() -> type[Strategy]:
    from hf_ckpt.strategies.oplevel.spec import OpLevel  # loaded when a setting first uses the kind
    return OpLevel


register_lazy("oplevel", _kind)
