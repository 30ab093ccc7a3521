"""hf_ckpt.measure: the storage tracker, FLOPs, timing rounds, bench settings and measure_step on a tiny model."""

from __future__ import annotations

import collections
import itertools

import pytest
import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

import hf_ckpt
from hf_ckpt.measure import (
    StorageTracker,
    count_flops,
    interleaved_step_times,
    measure_step,
    Setting,
    available_settings,
    parse_setting,
    register_setting,
    run_benchmark,
)
from hf_ckpt.measure import report as reporting
from hf_ckpt.measure.report import checks, pareto_front
from hf_ckpt.measure.settings import _REGISTRY, _upstream_functions


def tiny_llama(layers: int = 4):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, use_cache=False,
    )
    model = LlamaForCausalLM(config)
    input_ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": input_ids, "labels": input_ids}


# -- StorageTracker ---------------------------------------------------------------------------------------------


@pytest.mark.any_release
def test_tracker_counts_exact_bytes_of_new_storages_and_ignores_parameters_and_preexisting():
    parameter = nn.Parameter(torch.randn(100))
    before = torch.randn(50)
    with StorageTracker() as tracker:
        a = torch.empty(1000)                 # 4000 bytes
        view_of_parameter = parameter.view(10, 10)  # a view of a parameter: nothing new
        b = parameter.detach() * 2            # 400 bytes
        c = before + 1                        # 200 bytes
        before.add_(1)                        # in place on a pre-existing storage: nothing new
        view_of_a = a[:10]                    # a view of a tracked storage: nothing new
        assert tracker.live_bytes() == {"cpu": 4600}
        del a
        assert tracker.live_bytes() == {"cpu": 4600}  # the view keeps the storage alive
        del view_of_a
        assert tracker.live_bytes() == {"cpu": 600}
        d = torch.empty(10, dtype=torch.float64)  # 80 bytes
    assert tracker.live_bytes() == {"cpu": 680}
    assert tracker.peak_bytes() == {"cpu": 4600}
    del b, c, d, view_of_parameter
    assert tracker.live_bytes() == {}


@pytest.mark.any_release
def test_tracker_reset_peak_starts_from_live_bytes():
    with StorageTracker() as tracker:
        big = torch.empty(1000)
        del big
        small = torch.empty(10)
        tracker.reset_peak()
        assert tracker.peak_bytes() == {"cpu": 40}
    del small


@pytest.mark.parametrize("preserve", [True, False])
def test_tracker_counts_the_rng_state_checkpointing_keeps(preserve):
    """``torch.get_rng_state()`` makes its tensor without the dispatcher; checkpointing keeps one per call to replay
    dropout (5056 bytes on CPU), and it is activation memory like any other."""
    from torch.utils.checkpoint import checkpoint

    layer, x = nn.Linear(8, 8), torch.randn(4, 8, requires_grad=True)
    original = torch.get_rng_state
    with StorageTracker() as tracker:
        y = checkpoint(lambda a: torch.relu(layer(a)), x, use_reentrant=False, preserve_rng_state=preserve)
        expected = y.untyped_storage().nbytes() + (original().untyped_storage().nbytes() if preserve else 0)
        assert tracker.live_bytes() == {"cpu": expected}
    assert torch.get_rng_state is original  # put back on exit
    del y
    assert tracker.live_bytes() == {}


def test_tracker_counts_copies_made_by_saved_tensor_hooks():
    # exp saves its result. Without hooks the saved tensor *is* the output: 1024 bytes live. A pack hook that
    # copies (what offloading's save_on_cpu does) makes a storage of its own, which must be counted: 2048 bytes.
    x = torch.randn(256, requires_grad=True)
    with StorageTracker() as plain:
        y = x.exp()
    assert plain.live_bytes() == {"cpu": 1024}
    del y
    with StorageTracker() as hooked:
        with saved_tensors_hooks(lambda tensor: tensor.clone(), lambda packed: packed):
            y = x.exp()
    assert hooked.live_bytes() == {"cpu": 2048}
    y.sum().backward()
    assert torch.allclose(x.grad, x.detach().exp())


# -- FLOPs and timing ---------------------------------------------------------------------------------------------


@pytest.mark.any_release
def test_count_flops_of_a_matmul():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with count_flops() as flops:
        a @ b
    assert flops.total == 2 * 8 * 16 * 4


def test_count_flops_counts_attention_forward_and_backward_on_cpu():
    # torch's attention formulas: forward = 2 batched matmuls, backward = 5 (scores recomputed, dV, dScores,
    # dQ, dK). On a CPU, scaled_dot_product_attention runs a kernel FlopCounterMode has no formula for by itself.
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    one_matmul = 2 * (2 * 4) * 16 * 16 * 8
    with count_flops() as forward:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert forward.total == 2 * one_matmul
    with count_flops() as backward:
        out.sum().backward()
    assert backward.total == 5 * one_matmul


@pytest.mark.any_release
@pytest.mark.parametrize("count", [2, 3, 4, 5])
def test_interleaved_rounds_balance_positions_and_what_ran_before(count):
    """Every setting runs in every position, and right after every other setting, equally often over a cycle: what
    ran before a step (its memory footprint) must not land on one setting."""
    names = "abcde"[:count]
    cycle = count if count % 2 == 0 else 2 * count
    calls: list[str] = []
    ticks = itertools.count()
    times = interleaved_step_times(names, calls.append, repeat=cycle, warmup=1, clock=lambda: float(next(ticks)))
    assert times == {name: [1.0] * cycle for name in names}  # the warm-up round is not timed
    rounds = [calls[i:i + count] for i in range(count, len(calls), count)]  # the timed rounds
    assert all(sorted(round_) == list(names) for round_ in rounds)
    positions = collections.Counter((round_.index(name), name) for round_ in rounds for name in names)
    assert set(positions.values()) == {cycle // count}
    followers = collections.Counter(pair for round_ in rounds for pair in zip(round_, round_[1:]))
    assert len(followers) == count * (count - 1) and len(set(followers.values())) == 1


@pytest.mark.parametrize(
    ("repeat", "warmup", "message"),
    [(0, 1, "repeat must be a positive int; got 0"), (1, -1, "warmup must be an int >= 0; got -1")],
)
@pytest.mark.any_release
def test_interleaved_step_times_rejects_bad_counts(repeat, warmup, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        interleaved_step_times(["a"], lambda name: None, repeat=repeat, warmup=warmup)


@pytest.mark.any_release
def test_pareto_front_keeps_the_points_nothing_beats_on_both_axes():
    points = [(1.0, 100.0), (1.3, 10.0), (1.1, 50.0), (1.2, 60.0), (1.4, 10.0)]
    assert pareto_front(points) == [(1.0, 100.0), (1.1, 50.0), (1.3, 10.0)]


# -- settings ----------------------------------------------------------------------------------------------------


@pytest.mark.any_release
def test_an_unknown_setting_is_quoted_and_every_registered_syntax_listed():
    with pytest.raises(ValueError) as error:
        parse_setting("bogus")
    message = str(error.value)
    assert "'bogus'" in message
    assert all(syntax in message for syntax in available_settings())


@pytest.mark.parametrize(
    ("spec", "accepted"),
    [
        ("every_n:x", ("every_n:2",)),
        ("every_n:0", ("every_n:2",)),
        ("full:2", ()),
        ("upstream", ("upstream:full", "upstream:every_n:N")),
        ("upstream:offload", ("upstream:full", "upstream:every_n:N")),
    ],
)
@pytest.mark.any_release
def test_a_bad_setting_argument_quotes_the_setting_and_names_what_is_accepted(spec, accepted):
    with pytest.raises(ValueError) as error:
        parse_setting(spec)
    message = str(error.value)
    assert f"got {spec}" in message  # the offending spelling, as given
    assert all(value in message for value in accepted)


@pytest.mark.any_release
def test_parse_setting_canonical_names():
    assert [parse_setting(s).name for s in ("none", "full", "every_n:2", "upstream:full")] == [
        "none", "full", "every_n:2", "upstream:full"
    ]


@pytest.mark.any_release
def test_upstream_every_n_follows_the_installed_signature():
    import inspect

    import transformers

    method, upstream_enable, _ = _upstream_functions()
    if "every_n_layers" in inspect.signature(upstream_enable).parameters:
        assert parse_setting("upstream:every_n:2").name == "upstream:every_n:2"
    else:
        with pytest.raises(ValueError) as error:
            parse_setting("upstream:every_n:2")
        message = str(error.value)  # what cannot run, on which release and method, and what can instead
        for part in ("upstream:every_n:2", transformers.__version__, method, "every_n_layers", "upstream:full"):
            assert part in message


@pytest.mark.any_release
def test_register_setting_extends_the_parser():
    def factory(argument):
        return Setting(f"custom:{argument}", "test", apply=hf_ckpt.disable, remove=hf_ckpt.disable)

    register_setting("custom", factory, syntax="custom:X", help="a test setting")
    try:
        assert parse_setting("custom:7").name == "custom:7"
        assert available_settings()["custom:X"] == "a test setting"
    finally:
        del _REGISTRY["custom"]
    with pytest.raises(ValueError, match="'custom:7'"):
        parse_setting("custom:7")


def test_upstream_setting_runs_transformers_own_code_even_when_patched():
    model, _ = tiny_llama(layers=2)
    hf_ckpt.patch_transformers()
    try:
        setting = parse_setting("upstream:full")
        setting.apply(model)
        assert "_hf_ckpt_state" not in model.__dict__  # hf_ckpt's enable would have recorded its state
        assert hf_ckpt.checkpointed_layers(model) == [0, 1]
        setting.remove(model)
        assert hf_ckpt.checkpointed_layers(model) == []
    finally:
        hf_ckpt.unpatch_transformers()


# -- measure_step and run_benchmark on a tiny model ------------------------------------------------------------


def test_measure_step_memory_flops_and_recompute_on_tiny_llama():
    model, batch = tiny_llama()
    measured = {}
    for name, setting in (("none", None), ("full", 1), ("every_n:2", 2)):
        hf_ckpt.disable(model)
        if setting is not None:
            hf_ckpt.enable(model, every_n_layers=setting)
        measured[name] = measure_step(model, batch)
    hf_ckpt.disable(model)
    none, full, every_2 = measured["none"], measured["full"], measured["every_n:2"]

    assert full.retained_bytes < every_2.retained_bytes < none.retained_bytes
    assert full.flops > every_2.flops > none.flops
    assert none.recomputed_blocks == []
    assert full.recomputed_blocks == [0, 1, 2, 3]
    assert every_2.recomputed_blocks == [0, 2]
    assert every_2.block_runs == {0: 2, 1: 1, 2: 2, 3: 1}
    assert none.allocator_peak_bytes is None  # CPU: no allocator statistics
    assert none.retained_bytes_by_device == {"cpu": none.retained_bytes}
    assert none.loss == full.loss == every_2.loss


def test_measure_step_without_a_loss_names_the_fix():
    model, batch = tiny_llama(layers=1)
    with pytest.raises(ValueError, match=r"no loss.*labels.*loss_fn"):  # what is missing and both ways out
        measure_step(model, {"input_ids": batch["input_ids"]})


def test_run_benchmark_adds_the_baseline_and_checks_the_recompute():
    model, batch = tiny_llama()
    report = run_benchmark(model, batch, ["every_n:2", "full"], repeat=1, warmup=0)
    assert report.names == ["none", "every_n:2", "full"]
    assert report["every_n:2"].selected_blocks == report["every_n:2"].measurement.recomputed_blocks == [0, 2]
    assert report.retained_fraction("none") == 1.0
    assert 0 < report.retained_fraction("full") < report.retained_fraction("every_n:2") < 1
    recompute_checks = [check for check in checks(report) if "recomputed blocks" in check.name]
    assert len(recompute_checks) == 3 and all(check.passed for check in recompute_checks)
    assert hf_ckpt.checkpointed_layers(model) == []  # left with checkpointing off


def test_run_benchmark_times_steps_after_the_first_one_probe_per_setting(monkeypatch):
    """A training run measures its first step only: the timed rounds must not re-arm the probe each round."""
    from hf_ckpt.runtime.probe import RecomputeProbe

    finished = []
    real = RecomputeProbe._finish

    def counting(probe):
        finished.append(probe.setting)
        real(probe)

    monkeypatch.setattr(RecomputeProbe, "_finish", counting)
    model, batch = tiny_llama(layers=2)
    report = run_benchmark(model, batch, ["full", "every_n:2", "upstream:full"], repeat=3, warmup=1)
    assert len(finished) == 2  # full's and every_n:2's measured step; none of the 2 x 4 timed steps
    assert report["every_n:2"].measurement.recomputed_blocks == [0]
    assert all(len(result.step_times_s) == 3 for result in report.results)
    assert hf_ckpt.checkpointed_layers(model) == []  # left with checkpointing off, no record, no hooks
    assert "_hf_ckpt_state" not in model.__dict__
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


# -- the timing verdict: a 95% interval of the median paired ratio ---------------------------------------------


def _paired(ratios, base=0.3):
    """Reference step times drifting round to round (a neighbour's load), and ours at ``ratio`` x each."""
    reference = [base * (1 + 0.2 * (i % 5)) for i in range(len(ratios))]
    return [time * ratio for time, ratio in zip(reference, ratios)], reference


def _spread(centre, half_width, n=25):
    """n ratios evenly spread over centre +- half_width, shuffled (the order of rounds carries no information)."""
    values = [centre - half_width + 2 * half_width * i / (n - 1) for i in range(n)]
    return values[::2] + values[1::2]


@pytest.mark.parametrize(
    ("ratios", "verdict"),
    [
        (_spread(1.000, 0.01), reporting.PASS),  # no overhead, quiet machine
        (_spread(1.050, 0.01), reporting.FAIL),  # a 5% slowdown in every step
        (_spread(1.020, 0.06), reporting.INCONCLUSIVE),  # +2% median, a noisy machine: cannot tell
        (_spread(1.028, 0.05), reporting.INCONCLUSIVE),  # the old check's FAIL on noise (median +2.8%)
        (_spread(1.050, 0.01)[:-2] + [0.4, 3.0], reporting.FAIL),  # two rounds a neighbour wrecked: still over
        (_spread(1.000, 0.01)[:-2] + [0.4, 3.0], reporting.PASS),  # ... and still within
    ],
)
def test_the_timing_verdict_fails_only_when_the_whole_interval_is_over_the_limit(ratios, verdict):
    ours, reference = _paired(ratios)
    interval = reporting.overhead_interval(ours, reference)
    assert interval.rounds == 25 and interval.confidence >= 0.95
    assert interval.low <= interval.median <= interval.high
    assert interval.median == pytest.approx(sorted(ratios)[12] - 1)
    assert reporting.overhead_verdict(interval, 0.02) == verdict
    if verdict == reporting.PASS:
        assert interval.high <= 0.02
    elif verdict == reporting.FAIL:
        assert interval.low > 0.02
    else:
        assert interval.low <= 0.02 < interval.high


def test_the_interval_is_the_sign_test_one_and_narrows_with_more_rounds():
    ratios = _spread(1.0, 0.05, n=25)
    interval = reporting.overhead_interval(*_paired(ratios))
    ranked = sorted(ratios)
    assert (interval.low, interval.high) == pytest.approx((ranked[7] - 1, ranked[17] - 1))  # r(8), r(18) of 25
    wider = reporting.overhead_interval(*_paired(_spread(1.0, 0.05, n=9)))
    assert wider.high - wider.low > interval.high - interval.low


def test_too_few_rounds_for_95_percent_are_inconclusive_whatever_the_figures():
    interval = reporting.overhead_interval(*_paired([1.5] * 5))  # five rounds, each 50% over
    assert interval.confidence < 0.95 and "too few rounds" in interval.describe()
    assert reporting.overhead_verdict(interval, 0.02) == reporting.INCONCLUSIVE
    assert reporting.overhead_verdict(reporting.overhead_interval(*_paired([1.5] * 6)), 0.02) == reporting.FAIL


@pytest.mark.parametrize(
    ("ours", "reference", "confidence", "named"),
    [
        ([0.1, 0.1], [0.1], 0.95, "same rounds"),
        ([], [], 0.95, "same rounds"),
        ([0.1, 0.0], [0.1, 0.1], 0.95, "positive"),
        ([0.1], [0.1], 1.5, "confidence"),
    ],
)
def test_the_interval_refuses_bad_input_naming_it(ours, reference, confidence, named):
    with pytest.raises(ValueError, match=named):
        reporting.overhead_interval(ours, reference, confidence=confidence)


def test_a_check_verdict_and_passed_agree_and_old_checks_read_as_before():
    assert reporting.Check("c", "1", "<= 2", True).verdict == reporting.PASS
    assert reporting.Check("c", "3", "<= 2", False).label == "FAIL"
    unsure = reporting.Check("t", "+2%", "<= +2%", True, reporting.INCONCLUSIVE, (-0.01, 0.05))
    assert unsure.label == "INCONCLUSIVE (noisy machine)"
    with pytest.raises(ValueError, match="contradicts"):
        reporting.Check("t", "+9%", "<= +2%", True, reporting.FAIL)
    with pytest.raises(ValueError, match="verdict"):
        reporting.Check("t", "+9%", "<= +2%", True, "maybe")


def test_run_benchmark_switches_a_setting_with_its_own_remove_each_round():
    """Only hf_ckpt's own settings are parked; one with side effects of its own is applied and removed each round."""
    calls = []

    def apply(model):
        calls.append("apply")
        hf_ckpt.enable(model)

    def remove(model):
        calls.append("remove")
        hf_ckpt.disable(model)

    model, batch = tiny_llama(layers=2)
    own = Setting("own", "hf_ckpt.enable with side effects of its own", apply=apply, remove=remove)
    run_benchmark(model, batch, [own, "full"], repeat=2, warmup=0)
    assert calls == ["apply", "remove"] * 3  # measured once, then each of the 2 rounds
    assert "_hf_ckpt_state" not in model.__dict__
