"""The ``any_release`` mark, and the guard that keeps it honest.

A test marked ``any_release`` claims that its outcome cannot depend on the transformers or the torch release: it
builds no transformers model or config and no torch module, runs no autograd, starts no process. The release matrix and the torch range
(``ci/matrix.py``, ``ci/torch_range.py``) leave such tests out on every environment but the newest one, where the
default run has them; every other test runs on every release.

The claim is checked wherever the test runs (the default run included), not trusted: while a marked test runs, the
entry points of what could differ between releases are watched, and a marked test that reaches one fails, naming
what it reached and how to fix it (remove the mark):

* ``transformers.PreTrainedModel.__init__`` and ``transformers.PretrainedConfig.__init__`` (``__post_init__`` where
  configs are dataclasses; every model and config class calls them: building one from a config, on the meta device, through the estimator or a Trainer);
* ``torch.nn.Module.__init__`` (a transformers layer class, a toy model: what it does can change with the
  release);
* ``torch.autograd.backward`` and ``torch.autograd.grad`` (``Tensor.backward`` and checkpointing's recompute go
  through them);
* ``subprocess.Popen`` (a child process cannot be followed);
* and the test's fixtures: a marked test may use only function-scoped fixtures (and pytest's own), since a fixture
  of a wider scope may have done its work (built a model, run a step, started the processes whose results the
  test reads) before the test began, where nothing watches it; after the test, a fixture value that is a
  transformers object or a ``torch.nn.Module`` counts too.
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
from typing import Any, Callable, Iterator

import pytest

MARK = "any_release"
DESCRIPTION = (f"{MARK}: the outcome cannot depend on the transformers or torch release (no model, config or "
               "module, no autograd, no process: checked by tests/release_guard.py); the matrix and the torch range leave it "
               "out on every release but the newest")


def _entry_points() -> list[tuple[Any, str, str]]:
    """(owner, attribute, what reaching it means) for each watched entry point."""
    import torch
    import transformers

    return [
        (transformers.PreTrainedModel, "__init__", "builds a transformers model"),
        (transformers.PretrainedConfig, "__init__", "builds a transformers config"),
        # 5.x configs are dataclasses: their generated __init__ calls this one instead
        *[(transformers.PretrainedConfig, "__post_init__", "builds a transformers config")
          for _ in ("__post_init__",) if "__post_init__" in vars(transformers.PretrainedConfig)],
        (torch.nn.Module, "__init__", "builds a torch module"),
        (torch.autograd, "backward", "runs autograd (backward)"),
        (torch.autograd, "grad", "runs autograd (grad)"),
        (subprocess.Popen, "__init__", "starts a process"),
    ]


@contextlib.contextmanager
def watching(reached: list[str]) -> Iterator[None]:
    """Within the block, each watched entry point appends what it means to ``reached`` (and then runs as usual)."""
    originals = []
    for owner, name, what in _entry_points():
        original = owner.__dict__[name]

        def watched(*args: Any, _original: Callable = original, _what: str = what, **kwargs: Any) -> Any:
            reached.append(_what)
            return _original(*args, **kwargs)

        setattr(owner, name, functools.wraps(original)(watched))
        originals.append((owner, name, original))
    try:
        yield
    finally:
        for owner, name, original in reversed(originals):
            setattr(owner, name, original)


def _release_bound(value: Any) -> str | None:
    """What makes a fixture's value depend on the release (a transformers object, a torch module), if anything."""
    import torch

    values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else (value,)
    for item in values:
        if type(item).__module__.split(".", 1)[0] == "transformers":
            return f"a transformers {type(item).__name__}"
        if isinstance(item, torch.nn.Module):
            return f"a torch module ({type(item).__name__})"
    return None


#: The second mark: tests the release matrix runs on its ends only (the oldest and the newest release, and the torch
#: range's two environments), not on the releases between: the estimator's figures (it traces each release's
#: modelling code, whose memory at the ends brackets the releases between) and the checks of hf_ckpt's own source
#: (import layers, line and function-length bounds). CI's time is the reason: they are about 45 % of a release's
#: run. Not guarded (they build models): the claim is about cost, not about what a test may reach.
EDGE_MARK = "edge_releases"
EDGE_DESCRIPTION = (f"{EDGE_MARK}: run on the matrix's oldest and newest release (and the torch range's ends), not on "
                    "the releases between: the estimator's figures and the checks of hf_ckpt's own source")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", DESCRIPTION)
    config.addinivalue_line("markers", EDGE_DESCRIPTION)


def _wider_fixtures(item: pytest.Item) -> dict[str, str]:
    """The fixtures ``item`` uses whose scope is wider than the function (pytest's own left out), and their scope."""
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    wider = {}
    for name, chain in definitions.items():
        definition = chain[-1]
        module = getattr(definition.func, "__module__", "") or ""
        if definition.scope != "function" and not module.startswith(("_pytest", "pytest")):
            wider[name] = definition.scope
    return wider


@pytest.fixture(autouse=True)
def _any_release_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test marked ``any_release`` that reaches what can differ between releases (see the module)."""
    if request.node.get_closest_marker(MARK) is None:
        yield
        return
    reached: list[str] = []
    with watching(reached):
        yield
    held = {name: why for name, value in getattr(request.node, "funcargs", {}).items()
            if (why := _release_bound(value)) is not None}
    held.update({name: f"a fixture of scope {scope!r}, set up before the test is watched"
                 for name, scope in _wider_fixtures(request.node).items() if name not in held})
    found = sorted(set(reached)) + [f"uses fixture {name!r}, which holds {why}" for name, why in sorted(held.items())]
    if found:
        pytest.fail(f"marked {MARK}, but its outcome can depend on the release: it {'; it '.join(found)}. "
                    f"Remove the mark (the test then runs on every release).", pytrace=False)
