"""The release matrix (ci/matrix.py) and the compatibility page (ci/compat_report.py) report what really happened.

CI trusts these scripts for its verdict: a failed release must fail the run, a changed pin must build a fresh
environment, an interrupted build must not be reused, and the page must show what the sweep measured.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

#: Nothing here builds a model or config, runs autograd or starts a process (tests/release_guard.py checks it).
pytestmark = pytest.mark.any_release

CI = Path(__file__).resolve().parent.parent / "ci"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"hf_ckpt_ci_{name}", CI / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


matrix = _load("matrix")
compat_report = _load("compat_report")
sys.path.insert(0, str(CI))  # ci/sweep.py imports ci/matrix.py
sweep = _load("sweep")

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
  <testcase classname="tests.test_a" name="test_ok"/>
  <testcase classname="tests.test_a" name="test_ok_too"/>
  <testcase classname="tests.test_a" name="test_broken"><failure message="assert 1 == 2"/></testcase>
  <testcase classname="tests.test_a" name="test_fixture"><error message="fixture failed"/></testcase>
  <testcase classname="tests.test_a" name="test_known"><skipped type="pytest.xfail" message="known"/></testcase>
  <testcase classname="tests.test_a" name="test_skip"><skipped type="pytest.skip" message="no gpu"/></testcase>
</testsuite></testsuites>
"""


@pytest.mark.any_release
def test_the_ends_run_every_release_bound_test_and_the_releases_between_leave_out_the_edge_ones() -> None:
    """The newest release runs the whole default run, the oldest the release-bound tests, every release between them
    those less the tests marked edge_releases."""
    newest, oldest, between = matrix.RELEASES[-1], matrix.RELEASES[0], matrix.RELEASES[1:-1]
    assert matrix.default_tests(newest) == ["tests"]
    assert matrix.default_tests(oldest) == ["-m", "not slow and not any_release", "tests"]
    assert between and all(matrix.default_tests(release) == ["-m", "not slow and not any_release and not edge_releases",
                                                             "tests"] for release in between)


def test_junit_outcomes_are_counted_and_failures_named(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    result = matrix.Result("4.45.2", exit_status=1)
    matrix.read_junit(path, result)
    assert (result.passed, result.failed, result.errors, result.xfailed, result.skipped) == (2, 1, 1, 1, 1)
    assert result.failures == ["tests.test_a::test_broken", "tests.test_a::test_fixture"]
    assert not result.ok
    assert result.line().startswith("transformers 4.45.2: 2 passed, 2 failed, 1 xfailed, 1 skipped")


def test_a_release_whose_pytest_failed_without_failures_is_not_ok() -> None:
    result = matrix.Result("5.0.0", passed=3, exit_status=5)  # e.g. pytest collected nothing in one file
    assert not result.ok
    assert "[pytest exited with status 5]" in result.line()


def test_changing_a_pin_names_a_new_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matrix, "PINS_DIR", tmp_path)
    pins = tmp_path / "transformers-4.45.2.txt"
    pins.write_text("torch==2.13.0\ntransformers==4.45.2\ntokenizers==0.20.3\n")
    before = matrix.env_dir(tmp_path, "4.45.2")
    pins.write_text("# why these pins\ntorch==2.13.0\ntransformers==4.45.2\ntokenizers==0.20.3  # for 4.x\n")
    assert matrix.env_dir(tmp_path, "4.45.2") == before  # a comment is no reason to rebuild
    pins.write_text("torch==2.13.0\ntransformers==4.45.2\ntokenizers==0.20.4\n")
    assert matrix.env_dir(tmp_path, "4.45.2") != before
    assert matrix.pinned("4.45.2", "torch") == "torch==2.13.0"


def test_an_environment_without_its_stamp_is_not_reused(tmp_path: Path) -> None:
    env = tmp_path / "matrix-5.24.0-0123456789ab"
    env.mkdir()
    assert not matrix.env_is_built(env)  # an interrupted build leaves no stamp
    (env / matrix.STAMP).write_text(json.dumps({"hash": "ba9876543210"}))
    assert not matrix.env_is_built(env)  # a stamp for other pins
    (env / matrix.STAMP).write_text(json.dumps({"hash": "0123456789ab"}))
    assert matrix.env_is_built(env)


def test_every_release_has_pins_for_torch_and_transformers() -> None:
    for release in matrix.RELEASES:
        assert matrix.pinned(release, "transformers") == f"transformers=={release}"
        assert matrix.pinned(release, "torch") is not None


def _run_instead(monkeypatch: pytest.MonkeyPatch, outcome) -> list[str]:
    """``ci/matrix.py`` runs no pytest: ``outcome(release)`` is each release's result; returns the releases run."""
    ran = []

    def fake_run(release, args, echo):
        ran.append(release)
        (args.out / release).mkdir(parents=True, exist_ok=True)
        (args.out / release / "log.txt").write_text("")
        return outcome(release)

    monkeypatch.setattr(matrix, "run_release", fake_run)
    return ran


def test_the_run_fails_when_one_release_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    outcomes = {"4.45.2": matrix.Result("4.45.2", passed=5, exit_status=0),
                "5.24.0": matrix.Result("5.24.0", passed=4, failed=1, exit_status=1, failures=["t::x"])}
    _run_instead(monkeypatch, outcomes.get)
    status = matrix.main(["--releases", "4.45.2,5.24.0", "--out", str(tmp_path)])
    output = capsys.readouterr().out
    assert status == 1
    assert "transformers 4.45.2: 5 passed, 0 failed" in output
    assert "transformers 5.24.0: 4 passed, 1 failed" in output
    assert output.rstrip().splitlines()[-1] == "matrix: 9 passed, 1 failed"
    report = json.loads((tmp_path / "matrix.json").read_text())
    assert [(r["release"], r["ok"]) for r in report["releases"]] == [("4.45.2", True), ("5.24.0", False)]


PASSING = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" time="7.5">
  <testcase classname="tests.test_a" name="test_ok"/>
  <testcase classname="tests.test_a" name="test_skip"><skipped type="pytest.skip" message="no gpu"/></testcase>
</testsuite></testsuites>
"""


def _installed(monkeypatch: pytest.MonkeyPatch, release: str, **changed: str) -> None:
    """This interpreter, as far as the matrix can tell, has ``release``'s pins (torch as a local CPU build)."""
    versions = {line.split("==")[0]: line.split("==")[1] for line in matrix.pin_lines(release)}
    versions["torch"] += "+cpu"
    versions.update(changed)
    monkeypatch.setattr(matrix, "installed_version", versions.get)


def test_a_run_of_this_interpreter_is_adopted_only_with_the_releases_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _installed(monkeypatch, "4.45.2")
    assert matrix.adoptable(tmp_path) == (None, f"--adopt {tmp_path}: no JUnit report (*.xml) there")
    (tmp_path / "default.xml").write_text(PASSING)
    assert matrix.adoptable(tmp_path) == ("4.45.2", "")
    _installed(monkeypatch, "4.45.2", tokenizers="0.20.4")
    assert matrix.adoptable(tmp_path) == (
        None, f"--adopt {tmp_path}: not transformers 4.45.2's pins: tokenizers 0.20.4 (pinned 0.20.3)")
    _installed(monkeypatch, "4.45.2", transformers="4.46.0")
    assert matrix.adoptable(tmp_path) == (
        None, f"--adopt {tmp_path}: this interpreter has transformers 4.46.0, not a release of the matrix")


def test_an_adopted_release_is_not_run_again_and_counts_every_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    newest = tmp_path / "newest"
    newest.mkdir()
    (newest / "default.xml").write_text(PASSING)
    (newest / "slow.xml").write_text(JUNIT)
    (newest / "sweep.json").write_text(json.dumps({"transformers": "5.24.0"}))
    _installed(monkeypatch, "5.24.0")
    ran = _run_instead(monkeypatch, lambda release: matrix.Result(release, passed=5, exit_status=0))
    status = matrix.main(["--releases", "4.45.2,5.24.0", "--out", str(tmp_path / "out"), "--adopt", str(newest)])
    output = capsys.readouterr().out
    assert ran == ["4.45.2"] and status == 1  # the slow report holds a failure
    # test_skip is skipped in both reports (as a module skipped at collection is): counted once
    assert f"transformers 5.24.0: 3 passed, 2 failed, 1 xfailed, 1 skipped (adopted from {newest}, tests 8 s)" in output
    report = json.loads((tmp_path / "out" / "matrix.json").read_text())["releases"][1]
    assert (report["release"], report["sweep"], report["ok"]) == ("5.24.0", {"transformers": "5.24.0"}, False)


def test_the_oldest_release_is_the_torch_range_floors_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """CI runs the torch range first; the matrix takes its floor end (the oldest release on the floor torch)."""
    floor = tmp_path / "torch" / "torch-2.5.1"
    floor.mkdir(parents=True)
    (floor / "junit.xml").write_text(PASSING)
    (floor / "sweep.json").write_text(json.dumps({"transformers": "4.45.2", "torch": "2.5.1"}))
    pins = ["torch==2.5.1", "transformers==4.45.2"]
    (tmp_path / "torch" / "torch.json").write_text(json.dumps({"floor": "2.5", "ends": [
        {"torch": "2.5.1", "release": "4.45.2", "pins": pins, "env": "/envs/floor"},
        {"torch": "2.14.1", "release": "5.24.0", "pins": [], "env": "/envs/newest"}]}))
    ran = _run_instead(monkeypatch, lambda release: matrix.Result(release, passed=5, exit_status=0))
    status = matrix.main(["--releases", "4.45.2,4.51.3", "--out", str(tmp_path / "out"),
                          "--adopt-floor", str(tmp_path / "torch" / "torch.json")])
    assert (ran, status) == (["4.51.3"], 0)
    assert "transformers 4.45.2: 1 passed, 0 failed, 1 skipped (adopted from the torch range's floor run (torch 2.5.1)" \
        in capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "matrix.json").read_text())["releases"][0]
    assert (report["pins"], report["env"], report["sweep"]["torch"]) == (pins, "/envs/floor", "2.5.1")
    # read after the other releases ran (CI runs the torch range beside the matrix); missing, it fails the release
    missing = matrix.main(["--releases", "4.45.2,4.51.3", "--out", str(tmp_path / "out2"),
                           "--adopt-floor", str(tmp_path / "nowhere.json")])
    output = capsys.readouterr().out
    assert missing == 1 and f"transformers 4.45.2: 0 passed, 0 failed [--adopt-floor {tmp_path / 'nowhere.json'}: " \
        "no torch range report" in output


def test_a_run_that_cannot_be_adopted_is_run_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "default.xml").write_text(PASSING)
    _installed(monkeypatch, "5.24.0", peft="0.22.0")
    ran = _run_instead(monkeypatch, lambda release: matrix.Result(release, passed=5, exit_status=0))
    assert matrix.main(["--releases", "5.24.0", "--out", str(tmp_path / "out"), "--adopt", str(tmp_path)]) == 0
    assert ran == ["5.24.0"]
    assert f"--adopt {tmp_path}: not transformers 5.24.0's pins: peft 0.22.0 (pinned 0.21.2)" in capsys.readouterr().out


def _sweep(capabilities: dict, architectures: dict) -> dict:
    return {"torch": "2.13.0+cpu", "capabilities": capabilities, "sweep_seconds": 12.0,
            "architectures": architectures, "not_swept": {"gemma3_text": "not registered for causal-lm in this release"}}


def test_the_compatibility_page_shows_what_was_measured(tmp_path: Path) -> None:
    passed = dict.fromkeys(compat_report.VARIANTS, "passed")
    old = _sweep(
        {"gradient_checkpointing_layer": False, "every_n_layers": False, "offload": False,
         "activation_checkpointing_names": False},
        {"llama": {"task": "causal-lm", "class": "LlamaForCausalLM", "known_failure": None, **passed},
         "t5": {"task": "seq2seq", "class": "T5ForConditionalGeneration", "known_failure": None,
                **passed, "patched-every2": "failed: AssertionError: measured recompute [0, 1, 2, 3]"}},
    )
    new = _sweep(
        {"gradient_checkpointing_layer": True, "every_n_layers": True, "offload": True,
         "activation_checkpointing_names": True},
        {"llama": {"task": "causal-lm", "class": "LlamaForCausalLM", "known_failure": "why", "enable-every1": "failed: x"}},
    )
    release = {"failed": 0, "errors": 0, "xfailed": 0, "skipped": 0, "problem": None}
    data = {"releases": [{**release, "release": "5.24.0", "passed": 9, "sweep": new},
                         {**release, "release": "4.45.2", "passed": 8, "failed": 1, "sweep": old,
                          "pins": ["torch==2.13.0", "huggingface_hub==0.36.2", "peft==0.13.2"]}]}
    source = tmp_path / "matrix.json"
    source.write_text(json.dumps(data))
    page = tmp_path / "compatibility.md"
    assert compat_report.main(["--input", str(source), "--output", str(page)]) == 0
    text = page.read_text()
    # Exact rows on purpose: the page is the contract (Markdown that people read and --check compares), and each row
    # carries the measured facts (release, per-column verdicts, counts), so a row is compared as a whole.
    assert "| 4.45.2 | no | no | no | no | `every_n_layers`, selected inside each stack's loop" in text
    assert "`offload`" in text.split("| 4.45.2 | no |")[1].splitlines()[0]
    assert "| 5.24.0 | yes | yes | yes | yes |" in text
    assert "| `llama` | `LlamaForCausalLM` | ✓ | xfail |" in text  # releases in version order
    assert "| `t5` | `T5ForConditionalGeneration` | ✗ 3/4 | — |" in text
    assert "- `t5` (4.45.2; patched-every2): failed: AssertionError: measured recompute [0, 1, 2, 3]" in text
    assert "- `llama` (5.24.0): why" in text  # the known failure's reason
    assert "- `gemma3_text` (4.45.2, 5.24.0): not registered for causal-lm in this release" in text
    assert "| 4.45.2 | **1 failed** | 1 of 2 as expected | — |" in text
    assert "| 5.24.0 | green | 1 of 1 as expected | — |" in text
    assert "| 4.45.2 | 2.13.0 | 0.36.2 | — | 0.13.2 |" in text  # the pins that differ between releases


def _full_sweep(reviewed: bool = False) -> dict:
    """ci/sweep.py's JSON for two releases, both asserted: the older one with a failure, reviewed or not."""
    passed = dict.fromkeys(compat_report.VARIANTS, "passed")
    newest = {"llama": {"class": "LlamaModel", "modality": "text decoder", "known_failure": None, **passed},
              "vit": {"class": "ViTModel", "modality": "vision", "known_failure": None, **passed},
              "timm_x": {"class": "TimmX", "modality": "vision", "known_failure": "needs the optional dependency timm",
                         "enable-every1": "failed: ImportError: timm"}}
    ran = dict.fromkeys(sweep.CASES, "passed")  # every release runs 2 of the 4 cases
    older = {"llama": {"class": "LlamaModel", "modality": "text decoder", "known_failure": None, **ran},
             "vit": {"class": "ViTModel", "modality": "vision", "known_failure": "upstream bug" if reviewed else None,
                     **ran, "enable-every2": "failed: AssertionError: measured recompute [0]"}}
    return {"releases": [
        sweep.summarise("4.45.2", {"model_types": older, "supporting_model_types": 2, "torch": "2.13.0+cpu"},
                        True, 0 if reviewed else 1, 30.0),
        sweep.summarise("5.24.0", {"model_types": newest, "supporting_model_types": 3, "torch": "2.14.1+cu130"},
                        True, 0, 60.0),
    ]}


def test_the_sweep_asserts_every_release() -> None:
    data = _full_sweep()
    older, newest = data["releases"]
    assert newest["counts"] == {"passed": 2, "failed": 0, "xfail": 1, "xpass": 0} and newest["ok"]
    assert older["counts"] == {"passed": 1, "failed": 1, "xfail": 0, "xpass": 0} and not older["ok"]  # unreviewed
    assert sweep.line(newest) == "sweep 5.24.0: 2 of 3 model types passed, 1 known failures (asserted, 2 cases, 60 s)"
    assert sweep.line(older) == "sweep 4.45.2: 1 of 2 model types passed, 1 failed (asserted, 2 cases, 30 s) FAILED"
    assert newest["cases"] == older["cases"] == ["enable-every2", "patched-every1"]
    stale = sweep.summarise("5.24.0", {"model_types": {"x": {"known_failure": "why",
                                                                **dict.fromkeys(sweep.VARIANTS, "passed")}}},
                            True, 0, 1.0)
    assert stale["counts"]["xpass"] == 1 and not stale["ok"]  # a known failure that passes fails the sweep
    unexpected = sweep.summarise("5.24.0", {"model_types": {"x": {"known_failure": None}}}, True, 1, 1.0)
    assert not unexpected["ok"]


def test_two_sweeps_merge_into_one_report_in_release_order(tmp_path: Path) -> None:
    """CI sweeps the releases in two lanes, each merging into the same sweep.json."""
    path = tmp_path / "sweep.json"
    sweep._write(path, [{"release": "5.24.0"}], 10.0, merge=True)
    sweep._write(path, [{"release": "4.51.3"}, {"release": "4.45.2"}], 5.0, merge=True)
    merged = json.loads(path.read_text())
    assert [run["release"] for run in merged["releases"]] == ["4.45.2", "4.51.3", "5.24.0"]
    assert merged["seconds"] == 15.0
    sweep._write(path, [{"release": "5.0.0"}], 1.0, merge=False)  # without --merge: this run's releases only
    assert json.loads(path.read_text()) == {"releases": [{"release": "5.0.0"}], "seconds": 1.0}


def test_runs_sharing_a_queue_sweep_each_release_once_newest_first(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """CI's two lanes run ``ci/sweep.py --queue`` on one folder: each release is swept by the first run to claim
    it, newest first, and both runs merge into one sweep.json."""
    swept: list[tuple[int, str]] = []
    lane = [1]

    def fake_release(release, args):
        swept.append((lane[0], release))
        if release == matrix.RELEASES[-2]:
            lane[0] = 2  # the other lane starts while the first sweeps its second release
            assert sweep.main(["--queue", "--out", str(tmp_path)]) == 0
        return sweep.summarise(release, {"model_types": {"x": {"known_failure": None, **dict.fromkeys(sweep.CASES,
                                                                                               "passed")}}},
                               True, 0, 1.0)

    monkeypatch.setattr(sweep, "run_release", fake_release)
    assert sweep.main(["--queue", "--out", str(tmp_path)]) == 0
    newest_first = list(reversed(matrix.RELEASES))
    assert [release for _, release in swept] == newest_first  # each once, in that order
    assert [release for lane_, release in swept if lane_ == 1] == newest_first[:2]
    assert not sweep.claim(tmp_path, matrix.RELEASES[0])  # claimed already
    report = json.loads((tmp_path / "sweep.json").read_text())
    assert [run["release"] for run in report["releases"]] == list(matrix.RELEASES)


def test_every_release_runs_the_same_two_cases_asserted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each release in its matrix environment, the newest in the torch range's ceiling one (timm loads there), where
    the estimate over every model type runs too: a failure there fails the release's sweep."""
    commands, failing = {}, set()
    monkeypatch.setattr(sweep.matrix, "build_env", lambda *args, **kwargs: (tmp_path / "matrix-env", False))
    monkeypatch.setattr(sweep.torch_range, "build_env", lambda *args, **kwargs: (tmp_path / "ceiling-env", False))

    def fake_run(command, log, env=None, echo=False):
        commands.setdefault(command[3], []).append(
            (env.get("HF_CKPT_SWEEP_KNOWN"), "HF_CKPT_SWEEP_REPORT" in env, command[command.index("-k") - 1:]))
        return 1 if command[command.index("-k") - 1] in failing else 0

    monkeypatch.setattr(sweep.matrix, "run_logged", fake_run)
    args = sweep.argparse.Namespace(out=tmp_path, cache_dir=tmp_path, jobs=1, timeout=60)
    older, newest = sweep.run_release("4.45.2", args), sweep.run_release(sweep.NEWEST, args)
    junit = f"--junitxml={tmp_path}"
    cases = ["tests/test_architectures.py", "-k", "test_every_model_type and (enable-every2 or patched-every1)"]
    estimate = ["tests/test_estimate_every_type.py", "-k", "swept"]
    assert commands == {
        str(tmp_path / "matrix-env" / "bin" / "python"): [
            ("strict", True, [*cases, f"{junit}/4.45.2/junit.xml", "--tb=line"])],
        str(tmp_path / "ceiling-env" / "bin" / "python"): [
            ("strict", True, [*cases, f"{junit}/{sweep.NEWEST}/junit.xml", "--tb=line"]),
            ("strict", False, [*estimate, f"{junit}/{sweep.NEWEST}/junit-estimate.xml", "--tb=line"])],
    }
    assert older["cases"] == newest["cases"] == ["enable-every2", "patched-every1"]
    assert (older["exit_status"], newest["exit_status"]) == (0, 0)
    failing.add("tests/test_estimate_every_type.py")
    assert sweep.run_release(sweep.NEWEST, args)["exit_status"] == 1


def _matrix_json(tmp_path: Path) -> Path:
    passed = dict.fromkeys(compat_report.VARIANTS, "passed")
    new = _sweep({"gradient_checkpointing_layer": True, "every_n_layers": True, "offload": True,
                  "activation_checkpointing_names": True},
                 {"llama": {"task": "causal-lm", "class": "LlamaForCausalLM", "known_failure": None, **passed}})
    release = {"failed": 0, "errors": 0, "xfailed": 0, "skipped": 0, "problem": None, "exit_status": 0}
    source = tmp_path / "matrix.json"
    source.write_text(json.dumps({"releases": [{**release, "release": "5.24.0", "passed": 9, "sweep": new}]}))
    return source


def test_the_page_reports_every_model_type_by_modality(tmp_path: Path) -> None:
    source, full = _matrix_json(tmp_path), tmp_path / "sweep.json"
    full.write_text(json.dumps(_full_sweep()))
    page = tmp_path / "compatibility.md"
    assert compat_report.main(["--input", str(source), "--sweep", str(full), "--output", str(page)]) == 0
    text = page.read_text()
    # denominator, passed, xfail, failed, cases, the torch it ran on
    assert "| 5.24.0 | 3 | 2 (67%) | 1 | 0 | 2 | 2.14.1+cu130 |" in text
    assert "| 4.45.2 | 2 | 1 (50%) | 0 | 1 | 2 | 2.13.0+cpu |" in text
    assert "| vision | 0 / 1 | 1 / 2 |" in text and "| text decoder | 1 / 1 | 1 / 1 |" in text
    assert "- `timm_x` (5.24.0): needs the optional dependency timm" in text
    assert "### Failures on 4.45.2\n\n- `vit`: enable-every2: failed: AssertionError: measured recompute [0]" in text


def test_check_fails_when_the_page_is_not_what_the_run_gives(tmp_path: Path, capsys) -> None:
    source, full = _matrix_json(tmp_path), tmp_path / "sweep.json"
    full.write_text(json.dumps(_full_sweep(reviewed=True)))
    page = tmp_path / "compatibility.md"
    arguments = ["--input", str(source), "--sweep", str(full), "--output", str(page)]
    assert compat_report.main(arguments) == 0
    assert compat_report.main([*arguments, "--check"]) == 0  # as generated
    page.write_text(page.read_text().replace("60 s", "75 s"))  # a runtime: measured, not compared
    assert compat_report.main([*arguments, "--check"]) == 0
    page.write_text(page.read_text().replace("2 (67%)", "3 (100%)"))
    assert compat_report.main([*arguments, "--check"]) == 1
    assert "is not what this run gives" in capsys.readouterr().out
    compat_report.main(arguments)
    failing = json.loads(source.read_text())
    failing["releases"][0]["failed"] = 1
    source.write_text(json.dumps(failing))
    assert compat_report.main([*arguments, "--check"]) == 1  # a red run never checks out


def test_the_default_run_is_constrained_by_the_newest_releases_pins(capsys: pytest.CaptureFixture) -> None:
    # .ci/run installs the default run with these constraints, so --adopt finds that release's environment
    assert matrix.main(["--newest-pins"]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed == CI / "pins" / f"transformers-{matrix.RELEASES[-1]}.txt"
    assert f"transformers=={matrix.RELEASES[-1]}" in printed.read_text().splitlines()
    assert '-c "$(python ci/matrix.py --newest-pins)"' in (CI.parent / ".ci" / "run").read_text()


torch_range = _load("torch_range")


def test_the_torch_range_starts_at_the_declared_floor_and_ends_at_the_newest_release() -> None:
    (floor, oldest), (newest_torch, newest) = torch_range.ENDS
    assert torch_range.declared_floor() == ".".join(floor.split(".")[:2])  # pyproject's torch>= is what is tested
    assert (oldest, newest) == (matrix.RELEASES[0], matrix.RELEASES[-1])
    assert tuple(int(p) for p in newest_torch.split(".")) > tuple(int(p) for p in floor.split("."))
    # pyproject's ceiling excludes the first minor release after the tested one, and no tested release
    major, minor = (int(p) for p in newest_torch.split(".")[:2])
    assert torch_range.declared_ceiling() == f"{major}.{minor + 1}"


def test_an_end_is_its_releases_pins_with_torch_replaced(tmp_path: Path) -> None:
    pins = torch_range.constraints("2.5.1", "4.45.2")
    assert pins[0] == "torch==2.5.1" and [p for p in pins if p.startswith("torch==")] == ["torch==2.5.1"]
    assert set(pins[1:]) == {p for p in matrix.pin_lines("4.45.2") if not p.startswith("torch==")}
    # the ceiling end also pins and installs timm and torchvision (CUDA builds: they load beside its CUDA torch)
    top, newest_release = torch_range.ENDS[-1]
    ceiling = torch_range.constraints(top, newest_release)
    assert ceiling[0] == f"torch=={top}"
    assert [line.split("==")[0] for line in ceiling[-2:]] == ["torchvision", "timm"]
    assert torch_range.packages(top, newest_release)[-2:] == ["torchvision", "timm"]
    assert not {"torchvision", "timm"} & set(torch_range.packages("2.5.1", "4.45.2"))
    floor, newest = torch_range.env_dir(tmp_path, "2.5.1", "4.45.2"), torch_range.env_dir(tmp_path, top, newest_release)
    assert floor.name.startswith("torch-2.5.1-") and newest.name.startswith(f"torch-{top}-") and floor != newest
    # the machine's global pip constraints (a torch cap) are lifted for these builds alone
    assert torch_range.UNCAPPED["PIP_CONSTRAINT"] == "/dev/null" and "PIP_CONSTRAINT" not in os.environ
    assert not torch_range.env_is_built(floor)  # no stamp: an interrupted build is redone
    floor.mkdir()
    (floor / torch_range.STAMP).write_text(json.dumps({"hash": floor.name.rsplit("-", 1)[-1]}))
    assert torch_range.env_is_built(floor)


def test_a_torch_end_reports_its_skip_reasons_and_fails_the_run_when_red(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT.replace('message="no gpu"', 'message="this torch lacks torch.optim.Muon (torch &gt;= 2.9)"'))
    assert torch_range.skip_reasons(junit) == ["this torch lacks torch.optim.Muon (torch >= 2.9)"]

    top = torch_range.ENDS[-1][0]

    def fake_end(torch, release, args, echo):
        (args.out / f"torch-{torch}").mkdir(parents=True, exist_ok=True)
        (args.out / f"torch-{torch}" / "log.txt").write_text("")
        result = matrix.Result(release, passed=3, failed=int(torch == top), exit_status=int(torch == top),
                               failures=["t::x"] if torch == top else [])
        return {"torch": torch, **matrix.asdict(result), "skip_reasons": [], "ok": result.ok, "line": result.line()}

    monkeypatch.setattr(torch_range, "run_end", fake_end)
    assert torch_range.main(["--out", str(tmp_path)]) == 1
    assert f"FAILED [torch {top}] t::x" in capsys.readouterr().out
    report = json.loads((tmp_path / "torch.json").read_text())
    assert [(e["torch"], e["ok"]) for e in report["ends"]] == [("2.5.1", True), (top, False)]
    assert (report["floor"], report["ceiling"]) == (torch_range.declared_floor(), torch_range.declared_ceiling())


def test_the_page_has_a_torch_table_that_check_verifies(tmp_path: Path, capsys) -> None:
    source, full, torch_json = _matrix_json(tmp_path), tmp_path / "sweep.json", tmp_path / "torch.json"
    full.write_text(json.dumps(_full_sweep(reviewed=True)))
    end = {"failed": 0, "errors": 0, "problem": None, "exit_status": 0}
    torch_json.write_text(json.dumps({"floor": "2.5", "ends": [
        {**end, "torch": "2.5.1", "release": "4.45.2",
         "skip_reasons": ["this torch lacks torch.cpu.Stream.wait_event (x)", "no accelerator"]},
        {**end, "torch": "2.14.1", "release": "5.24.0", "skip_reasons": []}]}))
    page = tmp_path / "compatibility.md"
    arguments = ["--input", str(source), "--sweep", str(full), "--torch", str(torch_json), "--output", str(page)]
    assert compat_report.main(arguments) == 0
    text = page.read_text()
    assert "declares `torch>=2.5`." in text  # a run that records no ceiling
    with_ceiling = json.loads(torch_json.read_text())
    with_ceiling["ceiling"] = "2.16"
    assert "declares `torch>=2.5,<2.16`." in "\n".join(compat_report.render_torch(with_ceiling))
    assert "| 2.5.1 | 4.45.2 | green | `torch.cpu.Stream.wait_event (x)` |" in text  # only capability skips
    assert "| 2.14.1 | 5.24.0 | green | none |" in text
    assert compat_report.main([*arguments, "--check"]) == 0
    red = json.loads(torch_json.read_text())
    red["ends"][1]["failed"] = 2
    torch_json.write_text(json.dumps(red))
    assert compat_report.main([*arguments, "--check"]) == 1  # a red end never checks out
    assert "torch 2.14.1 (transformers 5.24.0): **2 failed**" in capsys.readouterr().out


def test_every_release_has_one_reviewed_reason_per_known_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep asserts each release against its own known failures: a type's entries never overlap there."""
    import arch_known_failures as known  # tests/ is on sys.path (conftest.py)

    for release in matrix.RELEASES:
        assert all(reason.strip() for reason in known.known_failures(release).values())
    assert "llama4" in known.known_failures("5.0.0") and "llama4" not in known.known_failures("5.15.1")
    assert known.known_failures("5.0.0")["llama4"] != known.known_failures("5.24.0")["llama4"]  # two upstream bugs
    monkeypatch.setitem(known.KNOWN_FAILURES, "x", (known.Known("<5.1", "one"), known.Known(">=4.57", "two")))
    with pytest.raises(ValueError, match=r"^x: 2 known-failure entries apply to 5\.0\.0$"):
        known.known_failures("5.0.0")
    assert known.known_failures("4.45.2")["x"] == "one"
