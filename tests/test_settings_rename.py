"""The bench's named configurations are *settings*; the old "strategy" names keep working for one release.

Every old spelling (``hf_ckpt.measure.Strategy``, ``parse_strategies``, module ``hf_ckpt.measure.strategies``,
``hf-ckpt bench --strategies``, ``run_benchmark(strategies=...)``, ``SettingResult.strategy``) gives what the new
one gives, with exactly one ``FutureWarning`` per use that names the new spelling and points at the caller's line;
the new spellings warn nothing.
"""

from __future__ import annotations

import importlib
import warnings

import pytest

import hf_ckpt.measure
from hf_ckpt.cli import build_parser
from hf_ckpt.measure import settings
from hf_ckpt.measure._renamed import RENAMED


def _one_future_warning(record: list[warnings.WarningMessage], new: str) -> warnings.WarningMessage:
    future = [w for w in record if issubclass(w.category, FutureWarning)]
    assert len(future) == 1, [str(w.message) for w in future]
    [warning] = future
    assert new in str(warning.message)
    return warning


@pytest.mark.parametrize("old", sorted(RENAMED))
@pytest.mark.any_release
def test_an_old_package_name_is_the_new_object_and_warns_once_at_the_callers_line(old):
    new = RENAMED[old]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        value = getattr(hf_ckpt.measure, old)
    assert value is getattr(hf_ckpt.measure, new)
    warning = _one_future_warning(record, new)
    assert warning.filename == __file__


@pytest.mark.any_release
def test_from_import_of_an_old_name_warns_once_not_twice():
    # ``from package import name`` looks the name up twice (importlib's check, then the statement itself)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        from hf_ckpt.measure import parse_strategies  # noqa: F401
    assert _one_future_warning(record, "parse_settings").filename == __file__
    assert parse_strategies is settings.parse_settings


@pytest.mark.parametrize("old", ["Strategy", "parse_strategy", "parse_strategies", "register_strategy", "available_strategies"])
@pytest.mark.any_release
def test_the_old_module_gives_the_new_objects_with_one_warning(old):
    module = importlib.import_module("hf_ckpt.measure.strategies")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        value = getattr(module, old)
    assert value is getattr(settings, RENAMED[old])
    assert _one_future_warning(record, RENAMED[old]).filename == __file__


@pytest.mark.any_release
def test_the_new_names_warn_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        names = [setting.name for setting in hf_ckpt.measure.parse_settings("none,full,every_n:2")]
        hf_ckpt.measure.Setting, hf_ckpt.measure.SettingResult, hf_ckpt.measure.available_settings  # noqa: B018
        args = build_parser().parse_args(["bench", "--settings", "full"])
    assert names == ["none", "full", "every_n:2"]
    assert [setting.name for setting in args.settings] == ["full"]


@pytest.mark.any_release
def test_bench_strategies_option_still_parses_into_settings_with_one_warning():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        args = build_parser().parse_args(["bench", "--strategies", "full,every_n:2"])
    assert [setting.name for setting in args.settings] == ["full", "every_n:2"]
    _one_future_warning(record, "--settings")


def test_run_benchmark_strategies_keyword_and_result_strategy_attribute_still_work():
    import torch

    from hf_ckpt.measure import build_workload, run_benchmark

    work = build_workload(
        "llama", layers=2, hidden=32, batch=1, seq=8, dtype=torch.float32, device=torch.device("cpu"), seed=0
    )
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        report = run_benchmark(work.model, work.batch, strategies=["full"], repeat=1, warmup=0)
    assert report.names == ["none", "full"]
    assert _one_future_warning(record, "settings=").filename == __file__
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        name = report["full"].strategy
    assert name == report["full"].setting == "full"
    assert _one_future_warning(record, "SettingResult.setting").filename == __file__
