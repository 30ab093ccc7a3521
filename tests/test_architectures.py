"""Architecture sweep: checkpointing is exact and recomputes what it says, on every architecture.

Two parametrised tests, each run for full checkpointing and ``every_n_layers=2``, enabled through
:func:`hf_ckpt.enable` and through the patched upstream method (``hf_ckpt.patch_transformers()``, then
``activation_checkpointing_enable`` / ``gradient_checkpointing_enable`` with the kwargs the Trainer passes;
unpatched after):

* ``test_gradient_parity_and_recomputed_blocks``: the task heads (causal LM, masked LM, seq2seq, with labels) of
  the common text architectures (``arch_zoo.COMMON``).
* ``test_every_model_type``: the base model class of every model type that supports checkpointing, built tiny
  generically (``arch_build``, outputs reduced to a scalar). By default a fixed stratified sample (``SAMPLE``: one
  or two per modality); with ``HF_CKPT_SWEEP=full`` every model type the release has (``ci/sweep.py``, CI). Known
  failures (``arch_known_failures.KNOWN_FAILURES``, reviewed per release) are strict xfails.

For each architecture the installed transformers provides (found by capability, so the list adapts to each
release), a tiny fp32 model runs one training step without checkpointing and then with it. Each run must

* give the same gradients for every parameter that gets one (max abs diff <= 1e-5) and no gradient to any other,
* recompute exactly blocks ``[0, 1, 2, 3]`` (``[0, 2]`` with ``every_n_layers=2``; in global order over every
  tower of a multimodal model), measured with :class:`hf_ckpt.runtime.counting.BlockRunCounter`, and report exactly those
  through ``checkpointed_layers`` (a block no gradient flows through, such as an unused last vision block, is
  reported but cannot be recomputed).

An architecture that cannot pass goes in ``KNOWN_FAILURES`` with the reason and a check of where it applies (so
far: wherever upstream's own checkpointing fails the same checks); there its cases are strict xfails, so they turn
red as soon as the architecture passes and the entry is stale. Nothing is skipped.

``HF_CKPT_ARCHITECTURES`` picks which common architectures the first test sweeps: ``common`` (the default, ``arch_zoo.COMMON``: what CI runs), a
comma-separated list of model types (to debug one), or ``all``: every causal-LM, masked-LM and seq2seq model type
the release registers, to find the next candidates for ``COMMON`` (the generic tiny recipe does not fit them all).

With ``HF_CKPT_SWEEP_REPORT=path.json`` in the environment the sweep writes what it found there (the release, its
upstream checkpointing capabilities, each architecture's result and the sweep's runtime), for
``ci/compat_report.py``.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import time
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import hf_ckpt
from hf_ckpt.runtime.util import compat as _compat
from hf_ckpt.runtime.blocks import find_blocks
from hf_ckpt.runtime.counting import BlockRunCounter

import arch_build  # tests/ is on sys.path (conftest.py)
import arch_check
import arch_zoo
import arch_known_failures
from transformers import __version__ as _transformers_version

TOLERANCE = arch_check.TOLERANCE
MINIMUM_ARCHITECTURES = 25
EVERY_N_LAYERS = arch_check.EVERY_N_LAYERS
ENTRY_POINTS = arch_check.ENTRY_POINTS

#: The default suite's stratified sample of the generic sweep: one or two model types per modality.
SAMPLE = (
    "llama",        # text decoder
    "bert",         # encoder
    "t5",           # encoder-decoder
    "vit", "segformer",  # vision (plain and hierarchical)
    "whisper",      # speech encoder-decoder
    "wav2vec2",     # audio encoder
    "clip",         # dual-tower multimodal
    "llava",        # vision-language model: a vision tower and a language model, blocks of both counted
    "mixtral",      # MoE
    "mamba",        # state-space
)


@dataclass(frozen=True)
class KnownFailure:
    """An architecture that cannot pass, why, and where: ``applies(arch)`` tells, by behaviour, on which releases."""

    reason: str
    applies: Callable[[arch_zoo.Architecture], bool]


def _upstream_fails(arch: arch_zoo.Architecture) -> bool:
    """Whether upstream's own checkpointing (its enable method, every block) fails the same checks on this release.

    The known failures below are upstream bugs in a model's own code: hf_ckpt cannot pass where upstream cannot,
    and must pass wherever upstream was fixed. Asking upstream keeps each entry true on every release.
    """
    try:
        _check(arch, "upstream", 1)
    except Exception:
        return True
    return False


#: Reviewed: every entry names the cause. Where it applies its cases are strict xfails (they turn red, as stale,
#: once they pass); where it does not, the architecture must pass like any other.
KNOWN_FAILURES: dict[str, KnownFailure] = {
    "umt5": KnownFailure(
        "UMT5Stack.forward keeps `hidden_states = layer_outputs[0]` inside its non-checkpointed branch, so the output "
        "of every checkpointed block is dropped and most parameters get no gradient (upstream bug, 4.45-4.51).",
        _upstream_fails,
    ),
    # starcoder2 (4.51) and gpt_bigcode (4.57) call their blocks directly and never checkpoint: hf_ckpt wraps them
    # (hf_ckpt/runtime/stacks/direct.py), so they pass on every release.
    "recurrent_gemma": KnownFailure(
        "The recurrent block keeps its state on the module between calls, so the recompute sees other inputs than "
        "the forward did and torch.utils.checkpoint raises a CheckpointError (upstream bug, up to 4.57).",
        _upstream_fails,
    ),
}

#: ``HF_CKPT_ARCHITECTURES``: ``common`` (default), ``all`` or a comma-separated list of model types.
ARCHITECTURES = arch_zoo.architectures(arch_zoo.selected(os.environ.get("HF_CKPT_ARCHITECTURES")))
_REPORT: dict[str, dict] = {}


@functools.lru_cache(maxsize=None)
def _known_failure(arch: arch_zoo.Architecture) -> KnownFailure | None:
    known = KNOWN_FAILURES.get(arch.model_type)
    return known if known is not None and known.applies(arch) else None


def _cases():
    for arch in ARCHITECTURES:
        known = _known_failure(arch)
        marks = [pytest.mark.xfail(strict=True, reason=known.reason)] if known else []
        for entry in ENTRY_POINTS:
            for every_n in EVERY_N_LAYERS:
                yield pytest.param(arch, entry, every_n, id=f"{arch.model_type}-{entry}-every{every_n}", marks=marks)


@functools.lru_cache(maxsize=1)
def _reference(arch: arch_zoo.Architecture):
    """Weights, batch and gradients of the model trained without checkpointing; nothing may be recomputed there."""
    model = arch_zoo.build(arch)
    inputs = arch_zoo.batch(arch)
    with BlockRunCounter(model) as runs:
        grads = arch_zoo.gradients(model, inputs)
    assert runs.recomputed() == [], "blocks ran twice without checkpointing"
    assert all(torch.isfinite(grad).all() for grad in grads.values()), "non-finite gradients without checkpointing"
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    return state, inputs, grads


def _enable(arch: arch_zoo.Architecture, entry: str, every_n: int, state: dict) -> torch.nn.Module:
    model = arch_zoo.build(arch)
    model.load_state_dict(state)
    if entry == "upstream":  # the release's own method, for _upstream_fails
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable({"use_reentrant": False})
        return model
    arch_check.enable(model, entry, every_n)
    return model


def _check(arch: arch_zoo.Architecture, entry: str, every_n: int) -> None:
    state, inputs, expected_grads = _reference(arch)
    model = _enable(arch, entry, every_n, state)
    blocks = find_blocks(model)
    assert len(blocks) == arch.expected_blocks, [b.name for b in blocks]
    expected = list(range(0, arch.expected_blocks, every_n))

    with BlockRunCounter(model) as runs:
        grads = arch_zoo.gradients(model, inputs)

    assert runs.recomputed() == expected, f"measured recompute {runs.recomputed()} (runs {dict(runs.counts)})"
    assert hf_ckpt.checkpointed_layers(model) == expected
    assert sorted(grads) == sorted(expected_grads), "a different set of parameters got gradients"
    worst = max((grads[name] - expected_grads[name]).abs().max().item() for name in expected_grads)
    assert worst <= TOLERANCE, f"max abs gradient difference {worst:.3g}"


@pytest.mark.parametrize(("arch", "entry", "every_n"), list(_cases()))
def test_gradient_parity_and_recomputed_blocks(arch: arch_zoo.Architecture, entry: str, every_n: int) -> None:
    variant = f"{entry}-every{every_n}"
    record = _REPORT.setdefault(
        arch.model_type,
        {"task": arch.task, "class": arch.class_name, "known_failure": getattr(_known_failure(arch), "reason", None)},
    )
    try:
        _check(arch, entry, every_n)
    except BaseException as error:
        record[variant] = f"failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
        raise
    record[variant] = "passed"


# ------------------------------------------------------------------------------- every model type, built generically

#: ``HF_CKPT_SWEEP``: ``sample`` (default: ``SAMPLE``), ``full`` (every model type) or comma-separated model types.
SWEEP = os.environ.get("HF_CKPT_SWEEP", "sample")
#: The reviewed known failures of the installed release (``arch_known_failures``).
GENERIC_KNOWN_FAILURES = arch_known_failures.known_failures(_transformers_version)
#: ``HF_CKPT_SWEEP_KNOWN=off`` drops the known-failure marks (to review a release: every failure is reported).
KNOWN = {} if os.environ.get("HF_CKPT_SWEEP_KNOWN") == "off" else GENERIC_KNOWN_FAILURES
_GENERIC_REPORT: dict[str, dict] = {}


def _generic_selection() -> list[arch_build.ModelType]:
    if SWEEP == "full":
        return arch_build.model_types()
    return arch_build.model_types(SAMPLE if SWEEP in ("", "sample") else tuple(SWEEP.split(",")))


GENERIC = _generic_selection()


def _too_slow(entry: arch_build.ModelType) -> bool:
    return GENERIC_KNOWN_FAILURES.get(entry.model_type, "").startswith(arch_known_failures.TOO_SLOW)


def _generic_cases():
    for entry in GENERIC:
        reason = KNOWN.get(entry.model_type)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        if _too_slow(entry):  # reported as a known failure without running: one step would take minutes
            marks = [pytest.mark.xfail(reason=GENERIC_KNOWN_FAILURES[entry.model_type], run=False)]
        for point in ENTRY_POINTS:
            for every_n in EVERY_N_LAYERS:
                yield pytest.param(entry, point, every_n, id=f"{entry.model_type}-{point}-every{every_n}",
                                   marks=marks)


_LAST_REFERENCE: dict[arch_build.ModelType, arch_check.Reference | BaseException] = {}


def _generic_reference(entry: arch_build.ModelType) -> arch_check.Reference:
    """The reference of ``entry``, built once for its 4 cases; a build that fails, fails all 4 without rebuilding."""
    if entry not in _LAST_REFERENCE:
        _LAST_REFERENCE.clear()
        try:
            _LAST_REFERENCE[entry] = arch_check.Reference(
                lambda: arch_build.build(entry), arch_build.inputs, arch_build.gradients, arch_build.live_blocks
            )
        except Exception as error:  # noqa: BLE001 (re-raised for each case)
            _LAST_REFERENCE[entry] = error
    found = _LAST_REFERENCE[entry]
    if isinstance(found, BaseException):
        raise found
    return found


@pytest.mark.parametrize(("entry", "point", "every_n"), list(_generic_cases()))
def test_every_model_type(entry: arch_build.ModelType, point: str, every_n: int) -> None:
    """The base model of a model type: gradient parity and exactly the selected blocks recomputed."""
    record = _GENERIC_REPORT.setdefault(entry.model_type, {
        "class": entry.class_name, "modality": arch_build.modality(entry),
        "known_failure": KNOWN.get(entry.model_type),
    })
    variant = f"{point}-every{every_n}"
    try:
        arch_check.check(_generic_reference(entry), point, every_n)
    except BaseException as error:
        record[variant] = f"failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
        raise
    record[variant] = "passed"


def test_sample_covers_every_modality() -> None:
    """The default sample keeps one model type per modality the release provides (none silently dropped)."""
    sampled = {entry.model_type for entry in arch_build.model_types(SAMPLE)}
    assert {"llama", "bert", "vit"} <= sampled, sorted(sampled)
    assert all(name not in GENERIC_KNOWN_FAILURES for name in SAMPLE), "the sample must not hold known failures"


def test_sweep_covers_the_common_architectures() -> None:
    """Discovery works on this release: it provides at least 25 of the common architectures."""
    found = arch_zoo.architectures()
    assert len(found) >= MINIMUM_ARCHITECTURES, [a.model_type for a in found]


def _capabilities() -> dict[str, bool]:
    """What upstream offers on this release, detected by hf_ckpt's own capability checks."""
    return {
        "gradient_checkpointing_layer": _compat.gradient_checkpointing_layer_class() is not None,
        "every_n_layers": _compat.upstream_supports_every_n_layers(),
        "offload": _compat.upstream_supports_offload(),
        "activation_checkpointing_names": _compat.has_activation_checkpointing_names(),
    }


def _not_swept() -> dict[str, str]:
    """Common architectures this release does not provide, and why."""
    swept = {arch.model_type for arch in arch_zoo.architectures()}
    reasons = {}
    for model_type, task in arch_zoo.COMMON.items():
        if model_type in swept:
            continue
        class_name = arch_zoo.registered_class(model_type, task)
        if class_name is None:
            reasons[model_type] = f"not registered for {task} in this release"
        else:
            reasons[model_type] = f"{class_name} does not declare supports_gradient_checkpointing"
    return reasons


@pytest.fixture(scope="module", autouse=True)
def _sweep_report():
    """Write the sweep's findings to ``$HF_CKPT_SWEEP_REPORT`` once the module has run."""
    started = time.monotonic()
    yield
    path = os.environ.get("HF_CKPT_SWEEP_REPORT")
    if not path:
        return
    import transformers

    for entry in GENERIC:  # not run: too slow to train tiny
        if _too_slow(entry) and entry.model_type not in _GENERIC_REPORT:
            _GENERIC_REPORT[entry.model_type] = {"class": entry.class_name, "modality": arch_build.modality(entry),
                                                 "known_failure": GENERIC_KNOWN_FAILURES[entry.model_type]}
    report = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "capabilities": _capabilities(),
        "sweep_seconds": round(time.monotonic() - started, 1),
        "architectures": _REPORT,
        "not_swept": _not_swept(),
        "sweep": SWEEP,
        "model_types": _GENERIC_REPORT,
        "supporting_model_types": len(arch_build.model_types()) if SWEEP == "full" else None,
    }
    with open(path, "w") as handle:
        json.dump(report, handle, indent=1, sort_keys=True)
