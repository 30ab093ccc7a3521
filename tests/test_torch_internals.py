"""Every entry of ``hf_ckpt.runtime._torch`` (the one module that names private torch APIs) works on the running torch.

CI runs this on the floor torch, the default one and the newest (``ci/torch_range.py``): the releases each entry's
docstring says it was verified on. An entry that may be missing on some torch returns None there; its test checks
that it is either the real thing or None.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch
from torch import nn

from hf_ckpt.runtime import _torch

PACKAGE = Path(__file__).resolve().parents[1] / "hf_ckpt"
#: The same pattern as /work/shared/tools/layers.py: torch._x, torch.a._x, _C._x, from torch... import _x.
PRIVATE = re.compile(r"\btorch(\.[A-Za-z0-9_]+)*\._[A-Za-z]|\b_C\._|from torch(\.[A-Za-z0-9_]+)* import _[A-Za-z]")


def test_no_other_module_of_the_package_names_a_private_torch_api():
    naming = []
    for path in sorted(PACKAGE.rglob("*.py")):
        code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        if PRIVATE.search(code):
            naming.append(str(path.relative_to(PACKAGE.parent)))
    assert naming == ["hf_ckpt/runtime/_torch.py"]


def test_every_entry_says_what_it_is_for_and_where_it_was_verified():
    entries = [name for name, value in vars(_torch).items()
               if callable(value) and getattr(value, "__module__", None) == _torch.__name__ and not name.startswith("_")]
    assert len(entries) >= 20
    for name in entries:
        doc = " ".join((getattr(_torch, name).__doc__ or "").split())
        assert "Verified on torch" in doc, name
        assert all(release in doc for release in _torch.VERIFIED_ON), name


def test_dispatch_and_pytree_entries():
    seen = []

    class Recording(_torch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Recording():
        torch.ones(2) + 1
    assert seen and all(_torch.is_op_overload(op) for op in seen)
    assert _torch.is_op(torch.ops.aten.mm) and _torch.is_op(torch.ops.aten.mm.default) and not _torch.is_op("mm")
    leaves, spec = _torch.tree_flatten({"a": [1, torch.ones(1)], "b": (2,)})
    assert _torch.tree_unflatten(leaves, spec)["b"] == (2,)
    assert _torch.tree_leaves(_torch.tree_map(lambda x: x, [1, (2, 3)])) == [1, 2, 3]
    seen.clear()
    with Recording(), _torch.disable_current_modes():
        torch.ones(2) * 2
    assert seen == []
    assert _torch.local_scalar_dense() is torch.ops.aten._local_scalar_dense.default
    assert _torch.aten_op("mm") is torch.ops.aten.mm and _torch.aten_op("no_such_op_anywhere") is None
    with _torch.disable_torch_function():
        assert torch.ones(1).item() == 1
    with _torch.fake_tensor_mode() as mode:
        fake = torch.empty(1024, 1024)
    assert type(fake).__name__ == "FakeTensor" and mode is not None


def test_autograd_entries():
    during, finished = [], []
    x = torch.ones(2, requires_grad=True)

    def hook(grad):
        during.append(_torch.in_backward())
        _torch.queue_backward_callback(lambda: finished.append(True))
        return grad

    x.register_hook(hook)
    (x * 2).sum().backward()
    assert during == [True] and finished == [True] and not _torch.in_backward()
    assert not _torch.saved_tensors_hook_active()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        assert _torch.saved_tensors_hook_active() or not hasattr(torch._C._autograd, "_top_saved_tensors_default_hooks")
    assert {"default", "none"} <= set(_torch.determinism_checks())
    module = nn.Linear(1, 1)
    handle = module.register_forward_pre_hook(lambda *args: None)
    assert handle.id in _torch.forward_pre_hooks(module)


def test_distributed_entries():
    wrapper = _torch.checkpoint_wrapper_module()
    if torch.distributed.is_available():
        assert wrapper is not None and hasattr(wrapper, "CheckpointWrapper")
        module = nn.Linear(1, 1)
        assert not _torch.composable_checkpoint_applied(module)
        from torch.distributed._composable import checkpoint

        checkpoint(module)
        assert _torch.composable_checkpoint_applied(module)
    assert _torch.active_ddp_module() is None


def test_partitioner_and_inductor_entries():
    config = _torch.functorch_config()
    assert config is not None and hasattr(config, "activation_memory_budget")
    assert _torch.ACTIVATION_MEMORY_BUDGET.endswith(".activation_memory_budget")
    partitioners = _torch.partitioners()
    assert partitioners is not None and hasattr(partitioners, "get_default_op_list")
    prims = _torch.rng_prims()
    assert prims is not None and all(callable(p) for p in prims)
    reparametrize = _torch.reparametrize_module()
    module = nn.Linear(1, 1, bias=False)
    with reparametrize(module, {"weight": torch.full((1, 1), 3.0)}):
        assert module(torch.ones(1)).item() == 3.0
    inductor = _torch.inductor_config()
    assert inductor is not None and hasattr(inductor, "fx_graph_cache")
    partitioner = _torch.custom_partitioner_class()
    assert partitioner is None or isinstance(partitioner, type)
    _torch.dynamo_reset()


def test_sac_respect_saved_tensors_hooks_is_set_where_the_context_has_it():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    forward, _ = create_selective_checkpoint_contexts(lambda ctx, op, *a, **k: CheckpointPolicy.PREFER_RECOMPUTE)
    has_it = hasattr(forward, "respect_saved_tensors_hooks")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _torch.set_sac_respects_saved_tensors_hooks(forward, False) is has_it
    if has_it:
        assert forward.respect_saved_tensors_hooks is False
