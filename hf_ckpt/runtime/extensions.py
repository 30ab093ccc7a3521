"""The runtime's extension points. The packages above it register here when ``hf_ckpt`` is imported (as PEFT's
``register_peft_method`` lets a tuner register itself), so the runtime never imports them: unwrappers (a wrapper's
inner module, or None), guards (``guard(target)``: a forward pre-hook or None; ``hf_ckpt.distributed``), wrapped
blocks (the indices engines' checkpoint wrappers cover), config checks (``check(model, config, owner)`` when a setting
is bound; DeepSpeed's ignored config) and the one saved-tensor hook (``hf_ckpt.strategies.outside``). Standard
library only: registering loads no torch."""

from __future__ import annotations

from typing import Any, Callable, Iterable

_UNWRAPPERS: list[Callable[[Any], Any]] = []
_GUARDS: list[Callable[[Any], Any]] = []
_WRAPPED: list[Callable[[Any], Iterable[int]]] = []
_CONFIG_CHECKS: list[Callable[[Any, Any, Any], None]] = []
_SAVED_TENSOR_HOOK: list[Callable[[], Any]] = []


def _adder(registry: list) -> Callable[[Any], Any]:
    def register(item: Any) -> Any:
        if item not in registry:
            registry.append(item)
        return item

    return register


#: Teach the runtime a kind of wrapper: ``unwrapper(obj)`` returns the module inside, or None.
register_unwrapper = _adder(_UNWRAPPERS)
#: ``guard(target)``: a forward pre-hook put on at every install without engine wrappers, or None.
register_guard = _adder(_GUARDS)
#: ``wrapped(target)``: blocks checkpoint wrappers cover (``checkpointed_layers`` counts them).
register_wrapped_blocks = _adder(_WRAPPED)
#: ``check(model, config, owner)``: run when a setting is bound, before any change.
register_config_check = _adder(_CONFIG_CHECKS)


def register_saved_tensor_hook(loader: Callable[[], Any]) -> Callable[[], Any]:
    """``loader()`` returns the saved-tensor hook's module (``resolve_outside``, ``install``); one at most."""
    _SAVED_TENSOR_HOOK[:] = [loader]
    return loader


def unwrappers() -> tuple[Callable[[Any], Any], ...]:
    """The registered unwrappers, in registration order."""
    return tuple(_UNWRAPPERS)


def guard_hooks(target: Any) -> list[Any]:
    """The pre-hooks the registered guards make for ``target``."""
    return [hook for hook in (guard(target) for guard in _GUARDS) if hook is not None]


def wrapped_blocks(target: Any) -> set[int]:
    """The indices of ``target``'s blocks that registered wrappers cover."""
    return {index for wrapped in _WRAPPED for index in wrapped(target)}


def check_config(model: Any, config: Any, owner: Any) -> None:
    """Run every registered config check."""
    for check in _CONFIG_CHECKS:
        check(model, config, owner)


def saved_tensor_hook() -> Any:
    """The saved-tensor hook's module; RuntimeError when nothing registered one."""
    if not _SAVED_TENSOR_HOOK:
        raise RuntimeError("no saved-tensor hook is registered: import hf_ckpt (hf_ckpt.strategies registers it)")
    return _SAVED_TENSOR_HOOK[0]()
