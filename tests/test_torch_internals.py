"""Every entry of ``hf_ckpt.runtime._torch`` (the one module that names private torch APIs) works on the running torch.

CI runs this on the floor torch, the default one and the newest (``ci/torch_range.py``): the releases each entry's
docstring says it was verified on. An entry that may be missing on some torch returns None there; its test checks
that it is either the real thing or None.
"""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from hf_ckpt.runtime import _torch

PACKAGE = Path(__file__).resolve().parents[1] / "hf_ckpt"
#: Private torch modules named in the source: torch._x, torch.a._x, _C._x, from torch... import _x.
PRIVATE = re.compile(r"\btorch(\.[A-Za-z0-9_]+)*\._[A-Za-z]|\b_C\._|from torch(\.[A-Za-z0-9_]+)* import _[A-Za-z]")


def test_no_other_module_of_the_package_names_a_private_torch_api():
    naming = []
    for path in sorted(PACKAGE.rglob("*.py")):
        code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        if PRIVATE.search(code):
            naming.append(str(path.relative_to(PACKAGE.parent)))
    assert naming == ["hf_ckpt/runtime/_torch.py"]


def _torch_private_attributes() -> frozenset[str]:
    """The private names (a leading underscore, no dunder) torch's objects have, read from torch itself: modules,
    tensors, parameters, aten ops, autograd nodes (an ``AddBackward0``'s ``_saved_alpha``) and AOT autograd's boxed
    functions (``_boxed_call``). An access ``x._name`` with one of them is a use of a private torch attribute."""
    op = torch.ops.aten.mm
    node = torch.ones(1, requires_grad=True).add(torch.ones(1, requires_grad=True), alpha=2).grad_fn
    boxed = _torch.aot_partitioner().make_boxed_func(lambda args: args) if _torch.aot_partitioner() else None
    holders = (nn.Module, nn.Module(), torch.Tensor, torch.ones(1), nn.Parameter(torch.ones(1)), op, op.default, node,
               boxed)
    return frozenset(name for holder in holders for name in dir(holder)
                     if name.startswith("_") and not (name.startswith("__") and name.endswith("__")))


def _own_attributes(tree: ast.AST) -> set[int]:
    """The ids of ``self._x`` nodes inside a class that assigns ``self._x`` itself: the class's own attribute, even
    where torch has one of that name (``BlockRunCounter._indices``)."""
    own = set()
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        accesses = [node for node in ast.walk(cls) if isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name) and node.value.id == "self"]
        assigned = {node.attr for node in accesses if isinstance(node.ctx, ast.Store)}
        own |= {id(node) for node in accesses if node.attr in assigned}
    return own


def _private_torch_uses(source: str, private: frozenset[str]) -> list[str]:
    """Each use of a private torch name in ``source``: ``x._attr`` (or ``getattr``/``hasattr``/``setattr`` with that
    name) for a torch private attribute, ``torch._x`` / ``torch.a._x``, ``import torch._x``,
    ``from torch... import _x``, and any import of ``functorch`` (torch's ``torch._functorch`` under a public name)."""
    tree, found = ast.parse(source), []
    own = _own_attributes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in own:
            root = ast.unparse(node).split(".")[0]
            if node.attr in private or (root == "torch" and node.attr.startswith("_") and not node.attr.endswith("__")):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in private):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            module = getattr(node, "module", None) or ""
            names = [alias.name for alias in node.names]
            dotted = [module] if isinstance(node, ast.ImportFrom) else names
            imported = names if isinstance(node, ast.ImportFrom) else []
            if any(m.split(".")[0] == "functorch" or m.split(".")[0] == "torch" and (any(
                    p.startswith("_") for p in m.split(".")) or any(n.startswith("_") for n in imported))
                   for m in dotted):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


#: How many uses of a private torch name (attributes included) the package may have outside ``runtime/_torch.py``.
PRIVATE_TORCH_USES_ALLOWED = 0


def test_no_other_module_uses_a_private_torch_attribute():
    """Counted with ``ast`` over the package, ``runtime/_torch.py`` excepted: the names read from torch itself."""
    private = _torch_private_attributes()
    uses = [f"{path.relative_to(PACKAGE.parent)}:{use}" for path in sorted(PACKAGE.rglob("*.py"))
            if path.name != "_torch.py" or path.parent.name != "runtime"
            for use in _private_torch_uses(path.read_text(), private)]
    assert len(uses) <= PRIVATE_TORCH_USES_ALLOWED, uses


def test_the_private_attribute_count_finds_each_form():
    private = _torch_private_attributes()
    assert {"_version", "_base", "_modules", "_parameters", "_buffers", "_call_impl", "_forward_hooks",
            "_schema", "_saved_alpha", "_boxed_call"} <= private
    forms = ["t._version", "m._modules.get('x')", "getattr(op, '_schema', None)", "torch._C.foo()",
             "torch.utils._pytree.tree_map", "import torch._dynamo", "from torch.utils import _pytree",
             "from torch._functorch import partitioners", "nn.Module._call_impl", "getattr(node, '_saved_alpha', 1)",
             "noting._boxed_call = True", "from functorch.compile import make_boxed_func", "import functorch.compile"]
    assert [len(_private_torch_uses(form, private)) for form in forms] == [1] * len(forms)
    fine = ["t.version", "self._hf_ckpt_state", "torch.nn.Module", "from torch import nn", "getattr(m, '_hf_x')",
            "class A:\n    def f(self):\n        self._indices = 1\n        return self._indices"]
    assert [_private_torch_uses(form, private) for form in fine] == [[]] * len(fine)


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
    with _torch.fake_tensor_mode(), pytest.raises(_torch.fake_tensor_errors()):
        torch.ones(4).nonzero()  # an output shape that depends on the values


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


def test_tensor_and_module_attribute_entries():
    x = torch.zeros(3)
    view = x[1:]
    before = _torch.version_counter(x)
    view.add_(1)
    assert _torch.version_counter(x) == before + 1 and _torch.view_base(view) is x and _torch.view_base(x) is None
    outer = nn.Sequential(nn.Linear(1, 1))
    assert _torch.child_modules(outer) == {"0": outer[0]}
    assert set(_torch.own_parameters(outer[0])) == {"weight", "bias"} and dict(_torch.own_parameters(outer)) == {}
    norm = nn.BatchNorm1d(1)
    assert "running_mean" in _torch.own_buffers(norm)
    assert outer.__call__.__func__ in _torch.module_call_functions()
    assert _torch.call_impl(outer)(torch.ones(1, 1)).shape == (1, 1)
    _torch.set_compiled_call(outer, lambda *args: "compiled")
    assert outer(torch.ones(1, 1)) == "compiled"
    _torch.set_compiled_call(outer, None)
    assert outer(torch.ones(1, 1)).shape == (1, 1)
    assert _torch.op_schema(torch.ops.aten.add_.Tensor).is_mutable and _torch.op_schema("add") is None


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
    mm = {torch.ops.aten.mm}
    with _torch.extra_recomputable_ops(lambda: mm):
        assert mm <= partitioners.get_default_op_list().recomputable_ops
    assert not mm <= partitioners.get_default_op_list().recomputable_ops


def test_sac_respect_saved_tensors_hooks_is_set_where_the_context_has_it():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    forward, _ = create_selective_checkpoint_contexts(lambda ctx, op, *a, **k: CheckpointPolicy.PREFER_RECOMPUTE)
    has_it = hasattr(forward, "respect_saved_tensors_hooks")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _torch.set_sac_respects_saved_tensors_hooks(forward, False) is has_it
    if has_it:
        assert forward.respect_saved_tensors_hooks is False
