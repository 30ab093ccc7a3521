"""Memory sizes and budgets as people write them: ``512MiB``, ``40GiB``, ``2e9B``, ``0.5``, ``50%``.

One parser for every place that takes a size or a budget (the CLI, ``hf_ckpt.enable(budget=...)``, the Trainer's
``gradient_checkpointing_kwargs``), so the rules are the same everywhere:

* a **size** always carries a unit: ``B``, ``KB``/``MB``/``GB``/``TB`` (powers of 1000) or
  ``KiB``/``MiB``/``GiB``/``TiB`` (powers of 1024), with or without a space, case-insensitive;
* a **budget** is a size, or a fraction of the no-checkpointing activation memory: a bare number in ``(0, 1]``
  or a percentage with ``%`` in ``(0, 100]``. A bare number is never bytes: ``1`` means 100%, not one byte.
"""

from __future__ import annotations

import math
import re

_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]+)\s*$", re.IGNORECASE)

#: What a budget may look like, for error messages.
BUDGET_FORMS = "a fraction in (0, 1] such as 0.5, a percentage such as 50%, or a size with a unit such as 40GiB"
#: The budget read from the device's free memory at the first training batch (:mod:`hf_ckpt.budget.forms`).
AUTO = "auto"
#: The forms a budget planned at the first training batch takes, for error messages.
DEFERRED_BUDGET_FORMS = f"{BUDGET_FORMS}, or 'auto' (the device's free memory minus a headroom)"
SIZE_FORMS = "a size with a unit: B, KB, MB, GB, TB, KiB, MiB, GiB or TiB (for example 512MiB, 40GiB, 2e9B)"


def parse_size(text: str) -> int:
    """Bytes in ``text`` (``"40GiB"`` -> 42949672960). Raises ValueError naming the accepted forms."""
    match = _SIZE.match(text) if isinstance(text, str) else None
    unit = _UNITS.get(match.group(2).lower()) if match else None
    if unit is None:
        raise ValueError(f"expected {SIZE_FORMS}; got {text!r}")
    size = float(match.group(1)) * unit
    if not math.isfinite(size) or size < 1:
        raise ValueError(f"a size must be at least 1B; got {text!r}")
    return int(size)


def check_fraction(value: float, text: object = None) -> float:
    """``value`` when it is a finite fraction in ``(0, 1]``; ValueError otherwise."""
    if not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise ValueError(f"a budget as a fraction must be in (0, 1]; got {text if text is not None else value!r}")
    return value


class _NoBudget(Exception):
    """Why a value is no budget: ``(error type, what is wrong, whether the message names the forms)``."""


def parse_budget(value: object, *, with_auto: bool = False) -> float | int | str:
    """A budget: a float fraction of the no-checkpointing activation memory, or an int number of bytes.

    Accepts a Python float (a fraction in ``(0, 1]``), a Python int (bytes, as ``hf_ckpt.plan`` always took
    them), or a string written as a person would: ``"0.5"`` or ``"1"`` (fractions: a bare number in text is
    never bytes), ``"50%"``, ``"40GiB"``. ``with_auto`` (a budget planned at the first training batch): ``"auto"``
    too, returned as :data:`AUTO`, and every error names :data:`DEFERRED_BUDGET_FORMS`.
    """
    if with_auto and isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    try:
        return _budget(value)
    except _NoBudget as bad:
        kind, why, named = bad.args
        forms = DEFERRED_BUDGET_FORMS if with_auto else BUDGET_FORMS if named else None
        raise kind(f"budget must be {forms}; {why}" if forms else why) from None


def _budget(value: object) -> float | int:
    """``value`` as a budget, or :class:`_NoBudget` saying why not."""
    if isinstance(value, bool):
        raise _NoBudget(TypeError, f"got {value!r}", True)
    if isinstance(value, int):
        if value < 1:
            raise _NoBudget(ValueError, f"budget in bytes must be positive; got {value!r}", False)
        return value
    if isinstance(value, float):
        if not (math.isfinite(value) and 0.0 < value <= 1.0):
            raise _NoBudget(ValueError, f"a budget as a fraction must be in (0, 1]; got {value!r}", False)
        return value
    if not isinstance(value, str):
        raise _NoBudget(TypeError, f"got {value!r} of type {type(value).__name__}", True)
    text = value.strip()
    try:
        if text.endswith("%"):
            return check_fraction(float(text[:-1]) / 100.0, value)
        return check_fraction(float(text), value)
    except ValueError as error:
        if text.endswith("%") or _looks_numeric(text):
            raise _NoBudget(ValueError, str(error), True) from None
    try:
        return parse_size(text)
    except ValueError:
        raise _NoBudget(ValueError, f"got {value!r}", True) from None


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def precision_label(dtype: str, autocast: str | None) -> str:
    """``float32``, or ``float32 with bfloat16 autocast`` under mixed precision: how reports name a step's dtypes."""
    return f"{dtype} with {autocast} autocast" if autocast else dtype


def format_bytes(n: float | None) -> str:
    """``n`` bytes as MiB, GiB or TiB, for tables and messages (``-`` for None)."""
    if n is None:
        return "-"
    if abs(n) >= 2**40:
        return f"{n / 2**40:.2f} TiB"
    if abs(n) >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.2f} MiB"


_FLOP_UNITS = ((1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "kFLOP"))


def format_flops(n: float | None) -> str:
    """``n`` floating-point operations in a readable unit (``964821.4534e9`` -> ``964.8 TFLOP``; ``-`` for None)."""
    if n is None:
        return "-"
    for scale, unit in _FLOP_UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} FLOP"
