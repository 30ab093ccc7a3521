#!/usr/bin/env python3
"""Write docs/compatibility.md from what the release matrix and the architecture sweep measured.

    python ci/matrix.py                 # writes build/matrix/matrix.json
    python ci/sweep.py                  # writes build/sweep/sweep.json (every model type)
    python ci/torch_range.py            # writes build/torch/torch.json (the floor torch and the newest)
    python ci/compat_report.py --torch build/torch/torch.json   # reads all three, writes docs/compatibility.md
    python ci/compat_report.py --torch build/torch/torch.json --check
                                        # CI: fails unless the committed page is what this run gives

``--check`` compares the committed page with the one this run's JSON renders, ignoring only the lines marked
``<!-- measured -->`` (runtimes), and fails if the run was not green: the page cannot drift from what CI checks.

Several inputs can be given (``--input a.json b.json``); a release found in more than one comes from the last.
Everything on the page comes from the JSON: the upstream capabilities were detected in each release's own
environment (by capability, never by version string), the results are those the tests measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep import VARIANTS  # noqa: E402  (ci/sweep.py: the four cases, and a model type's outcome over those run)
from sweep import outcome as _outcome  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INPUT = ROOT / "build" / "matrix" / "matrix.json"
DEFAULT_SWEEP = ROOT / "build" / "sweep" / "sweep.json"
DEFAULT_TORCH = ROOT / "build" / "torch" / "torch.json"
#: How tests/torch_capabilities.py words the reason of a test skipped for a capability the running torch lacks.
LACKS = "this torch lacks "
DEFAULT_OUTPUT = ROOT / "docs" / "compatibility.md"
MEASURED = "<!-- measured -->"
MODALITIES = ("text decoder", "encoder", "encoder-decoder", "vision", "audio/speech", "multimodal", "MoE",
              "state-space/hybrid")

PINNED_APART = ("torch", "huggingface_hub", "tokenizers", "peft")
TASK_TITLES = {"causal-lm": "Causal LM", "masked-lm": "Masked LM", "seq2seq": "Encoder-decoder (seq2seq)"}


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else 0 for part in version.split("."))


def load(paths: list[Path]) -> list[dict]:
    releases: dict[str, dict] = {}
    for path in paths:
        for release in json.loads(path.read_text())["releases"]:
            releases[release["release"]] = release
    return [releases[key] for key in sorted(releases, key=_version_key)]


def _yes(flag: bool | None) -> str:
    return "—" if flag is None else ("yes" if flag else "no")


def hf_ckpt_adds(capabilities: dict[str, bool]) -> list[str]:
    """What hf_ckpt offers on a release beyond what upstream does there, from upstream's capabilities."""
    adds = []
    if capabilities.get("every_n_layers"):
        adds.append("`every_n_layers` on stack-flag models too (upstream counts `GradientCheckpointingLayer` blocks only)")
    elif capabilities.get("gradient_checkpointing_layer"):
        adds.append("`every_n_layers`")
    else:
        adds.append("`every_n_layers`, selected inside each stack's loop (every model here keeps the flag on its stack)")
    if not capabilities.get("offload"):
        adds.append("`offload`")
    if capabilities.get("activation_checkpointing_names"):
        adds.append("the mixin under both names (`activation_checkpointing_*` and the deprecated `gradient_checkpointing_*`)")
    adds.append("`checkpointed_layers()` and measured recompute (`BlockRunCounter`)")
    return adds


def _counts(release: dict) -> str:
    """The default suite's verdict on a release (not its test counts: those change with every new test)."""
    failed = release["failed"] + release["errors"]
    if release.get("problem"):
        return f"not run ({release['problem']})"
    if failed:
        return f"**{failed} failed**"
    if release.get("exit_status") not in (0, None):
        return f"**pytest exited with status {release['exit_status']}**"
    return "green"


def _outcomes(run: dict) -> dict[str, str]:
    """Each model type's outcome in one release's full sweep, over the cases that release ran."""
    cases = tuple(run.get("cases", VARIANTS))
    return {name: _outcome(record, cases) for name, record in run["sweep"]["model_types"].items()}


def _first_failure(record: dict, cases: tuple[str, ...] = VARIANTS) -> str:
    for variant in cases:
        if record.get(variant, "not run") != "passed":
            return f"{variant}: {record.get(variant, 'not run')}"
    return ""


def render_full_sweep(sweep: dict | None) -> list[str]:
    """The section on every model type: denominator, passing count, table by modality, failures with reasons."""
    if not sweep or not sweep.get("releases"):
        return []
    runs = [r for r in sweep["releases"] if (r.get("sweep") or {}).get("model_types")]
    if not runs:
        return []
    names = [r["release"] for r in runs]
    lines = [
        "## Every model type",
        "",
        "`ci/sweep.py` builds the base model class of **every model type that supports checkpointing** on each "
        "release (every class in the auto mappings declaring `supports_gradient_checkpointing = True`, deduplicated "
        "by model type) tiny and generically from its config class's own fields (`tests/arch_build.py`), with "
        "inputs generated from its `main_input_name` and `forward` signature, and runs 2 of the 4 cases "
        "(`hf_ckpt.enable` with `every_n_layers=2`, the patched `gradient_checkpointing_enable` with every layer: "
        "each entry point and each selection once; the default suite runs all 4 on its stratified sample and on the "
        "common architectures' task heads, below). The sweep is asserted on every release: each model type passes or "
        "is a strict expected failure reviewed for that release (below, with its reason), so an upstream fix turns it "
        "red until the entry is narrowed or removed.",
        "",
        "Where a model's loop calls its blocks directly and never hands them to a checkpoint function (its stack keeps "
        "a `gradient_checkpointing` flag, but no method of the stack names `_gradient_checkpointing_func` or "
        "`checkpoint`), hf_ckpt checkpoints the selected blocks itself by wrapping their `forward`, as torch's "
        "`checkpoint_wrapper` does (`hf_ckpt/runtime/stacks/direct.py`; `disable` unwraps them): so pass CLVP's text and speech "
        "encoders (`clvp`), Mllama's vision encoder (`mllama`), HGNetV2's encoder (`pp_ocrv5_server_rec`) and "
        "PP-LCNetV4's encoder (`pp_ocrv6_small_rec`). Where a stack's loop calls torch's `checkpoint` by name and "
        "never its bound function (CLVP's encoders and decoder before 5.16: every block checkpointed whatever was "
        "selected), hf_ckpt keeps that stack's flag off and wraps the selected blocks the same way. A model that "
        "only declares support (no module of it has the "
        "flag or is a `GradientCheckpointingLayer`) gets the flag from hf_ckpt and its stack's list of repeated "
        "blocks wrapped the same way: so pass Gemma 3n's and Gemma 4's audio encoders (`gemma3n_audio`, "
        "`gemma4_audio`), MuseSpark's audio model (`muse_spark_audio`), PP-LCNetV4 (`pp_lcnet_v4`) and, on 4.45, "
        "VAN (`van`). Where a flag sits above a nested loop that checkpoints (Fuyu, SEW-D on 4.45), nothing is "
        "wrapped. The newest release is swept on the newest torch, in the torch range's ceiling environment, "
        "which also installs `timm` and `torchvision` (the TimmWrapper towers of `perception_lm`, `pe_video` and "
        "`pe_audio_video`; the index's torchvision is a CUDA build, which loads beside the CUDA torch there but not "
        "beside the matrix's CPU torch), and `scipy` (`inkling_mm_model`).",
        "",
        "| transformers | model types that support checkpointing | passed | known failures (xfail) | failed | cases "
        "| torch |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    outcomes = {run["release"]: _outcomes(run) for run in runs}
    for run in runs:
        counts = {name: 0 for name in ("passed", "failed", "xfail", "xpass")}
        for found in outcomes[run["release"]].values():
            counts[found] += 1
        total = len(outcomes[run["release"]])
        share = f" ({100 * counts['passed'] / total:.0f}%)" if total else ""
        failed = counts["failed"] + counts["xpass"]
        torch = run["sweep"].get("torch", "")
        lines.append(f"| {run['release']} | {total} | {counts['passed']}{share} | {counts['xfail']} | {failed} "
                     f"| {len(run.get('cases', VARIANTS))} | {torch} |")
    timing = ", ".join(f"{r['release']} {r['seconds']:.0f} s" for r in runs)
    lines += ["", f"Sweep runtime in the run this page comes from: {timing}. {MEASURED}", ""]
    lines += ["### By modality", "", "Passed / model types, per release.", "",
              "| modality | " + " | ".join(names) + " |", "| --- | " + " | ".join("---" for _ in names) + " |"]
    for modality in MODALITIES:
        cells = []
        for run in runs:
            records = [m for m, r in run["sweep"]["model_types"].items() if r.get("modality") == modality]
            passed = sum(outcomes[run["release"]][m] == "passed" for m in records)
            cells.append(f"{passed} / {len(records)}" if records else "—")
        lines.append(f"| {modality} | " + " | ".join(cells) + " |")
    lines += ["", "### Known failures", "",
              "Each is a strict expected failure in `tests/arch_known_failures.py` on the releases listed, with its "
              "reviewed reason.", ""]
    by_reason: dict[str, dict[str, list[str]]] = {}
    for run in runs:
        for model_type, record in sorted(run["sweep"]["model_types"].items()):
            if record.get("known_failure"):
                by_reason.setdefault(record["known_failure"], {}).setdefault(model_type, []).append(run["release"])
    for reason, found in sorted(by_reason.items(), key=lambda item: (-len(item[1]), item[0])):
        where = ", ".join(f"`{m}` ({_span(releases, names)})" for m, releases in sorted(found.items()))
        lines.append(f"- {where}: {reason}")
    for run in runs:
        failing = [(m, r) for m, r in sorted(run["sweep"]["model_types"].items())
                   if outcomes[run["release"]][m] in ("failed", "xpass")]
        if failing:
            lines += ["", f"### Failures on {run['release']}", ""]
            lines += [f"- `{m}`: {_first_failure(r, tuple(run.get('cases', VARIANTS)))}" for m, r in failing]
    return lines + [""]


def _span(releases: list[str], order: list[str]) -> str:
    """``releases`` as runs of consecutive releases of ``order``: "4.45.2 to 5.0.0, 5.22.2"."""
    runs: list[list[str]] = []
    for release in sorted(releases, key=order.index):
        if runs and order.index(release) == order.index(runs[-1][-1]) + 1:
            runs[-1].append(release)
        else:
            runs.append([release])
    return ", ".join(run[0] if len(run) == 1 else f"{run[0]} to {run[-1]}" for run in runs)


def _cell(result: dict | None) -> str:
    """One architecture on one release: ✓ (every variant passed), ✗ k/4, xfail, or — (not swept)."""
    if result is None:
        return "—"
    outcomes = [result.get(variant, "not run") for variant in VARIANTS]
    passed = sum(outcome == "passed" for outcome in outcomes)
    if result.get("known_failure"):
        return "xfail" if passed < len(VARIANTS) else "XPASS (stale known failure)"
    if passed == len(VARIANTS):
        return "✓"
    return f"✗ {passed}/{len(VARIANTS)}"


def _grouped(items: list[tuple[str, str, str, str]]) -> list[str]:
    """``(model type, release, case, text)`` as one line per model type and text, naming the releases and cases."""
    groups: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    for model_type, release, case, text in items:
        releases, cases = groups.setdefault((model_type, text), ([], []))
        if release not in releases:
            releases.append(release)
        if case and case not in cases:
            cases.append(case)
    lines = []
    for (model_type, text), (releases, cases) in sorted(groups.items()):
        where = ", ".join(releases)
        if cases:
            where += "; " + ("all 4 cases" if len(cases) == len(VARIANTS) else ", ".join(cases))
        lines.append(f"- `{model_type}` ({where}): {text}")
    return lines


def _notes(swept: list[dict]) -> list[str]:
    known, failed, absent = [], [], []
    for release in swept:
        name = release["release"]
        for model_type, result in release["sweep"]["architectures"].items():
            if result.get("known_failure"):
                known.append((model_type, name, "", result["known_failure"]))
                continue
            for variant in VARIANTS:
                outcome = result.get(variant, "not run")
                if outcome != "passed":
                    failed.append((model_type, name, variant, outcome))
        for model_type, reason in release["sweep"].get("not_swept", {}).items():
            absent.append((model_type, name, "", reason))
    lines = []
    for title, items in (("Known failures", known), ("Failures", failed), ("Not provided", absent)):
        if items:
            lines += [f"### {title}", "", *_grouped(items), ""]
    return lines


def lacking(end: dict) -> list[str]:
    """What the tests found missing from one end's torch: the capabilities named by its skipped tests' reasons."""
    return sorted({reason[len(LACKS):] for reason in end.get("skip_reasons", []) if reason.startswith(LACKS)})


def render_torch(torch_data: dict | None) -> list[str]:
    """The torch range section: the default suite on the floor torch and on the newest (ci/torch_range.py)."""
    if not torch_data:
        return []
    lines = [
        "## torch",
        "",
        f"hf_ckpt declares `torch>={torch_data['floor']}"
        + (f",<{torch_data['ceiling']}" if torch_data.get("ceiling") else "") +
        "`. CI runs the default suite's release-bound tests (those not marked `any_release`) on the ends of that "
        "range, each in its own environment (`ci/torch_range.py`: the transformers release's pins with torch "
        "replaced); the floor's run is also the matrix's run of its release (the pins table above), every other "
        "release runs on the pins' torch. A feature the running torch "
        "lacks is refused at the call, naming the torch capability it needs; its tests are skipped, the capability "
        "as the reason.",
        "",
        "| torch | transformers | default suite | features that torch lacks (their tests skipped) |",
        "| --- | --- | --- | --- |",
    ]
    for end in torch_data["ends"]:
        missing = "; ".join(f"`{name}`" for name in lacking(end)) or "none"
        lines.append(f"| {end['torch']} | {end['release']} | {_counts(end)} | {missing} |")
    return [*lines, ""]


def render(releases: list[dict], sweep_data: dict | None = None, torch_data: dict | None = None) -> str:
    swept = [r for r in releases if r.get("sweep")]
    lines = [
        "# Compatibility",
        "",
        "<!-- Generated by `python ci/compat_report.py` from the JSON `python ci/matrix.py` writes. Do not edit. -->",
        "",
        "hf_ckpt is tested on every transformers release below, each in its own environment (torch "
        + ", ".join(sorted({r["sweep"]["torch"] for r in swept})) + ", CPU, fp32). "
        "The default test run (`python -m pytest`) runs on each (less, but on the newest, the tests marked `any_release`, "
        "whose outcome cannot depend on the release, and, on the releases between the oldest and the newest, those "
        "marked `edge_releases`: the estimator's figures and the checks of hf_ckpt's own source), and on the newest "
        "the slow tests too (`-m slow`: "
        "the estimator's and planners' figures against measured steps on real models, the examples and entry "
        "points in fresh interpreters, the docs' code); the architecture sweep "
        "(`tests/test_architectures.py`) trains tiny models for one step, with and without checkpointing, and "
        "checks that the gradients agree (max abs difference <= 1e-5) and that exactly the selected blocks were recomputed (measured by counting block "
        "runs; every tower of a multimodal model, blocks in global order), for full checkpointing and "
        "`every_n_layers=2`, through `hf_ckpt.enable` and through the patched `gradient_checkpointing_enable` "
        "(`hf_ckpt.patch_transformers()`): 4 cases per model. The default suite sweeps the task heads of the "
        "common text architectures and a stratified sample of the generic sweep; `ci/sweep.py` sweeps every "
        "model type (below). This page is written by `ci/compat_report.py` from the CI run's JSON and CI checks "
        "it with `--check`.",
        "",
        "## Releases",
        "",
        "What upstream transformers offers on each release, detected in that release's environment, and what hf_ckpt "
        "adds there.",
        "",
        "| transformers | `GradientCheckpointingLayer` | upstream `every_n_layers` | upstream `offload` "
        "| `activation_checkpointing_*` names | hf_ckpt adds |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for release in swept:
        capabilities = release["sweep"]["capabilities"]
        lines.append(
            f"| {release['release']} | {_yes(capabilities.get('gradient_checkpointing_layer'))} "
            f"| {_yes(capabilities.get('every_n_layers'))} | {_yes(capabilities.get('offload'))} "
            f"| {_yes(capabilities.get('activation_checkpointing_names'))} | {'; '.join(hf_ckpt_adds(capabilities))} |"
        )
    lines += [
        "",
        "Each environment is pinned by `ci/pins/transformers-<release>.txt`; the pins that differ between releases:",
        "",
        "| transformers | " + " | ".join(f"`{name}`" for name in PINNED_APART) + " |",
        "| --- | " + " | ".join("---" for _ in PINNED_APART) + " |",
    ]
    for release in releases:
        versions = dict(line.split("==", 1) for line in release.get("pins", []) if "==" in line)
        versions = {name.lower().replace("-", "_"): version for name, version in versions.items()}
        lines.append(f"| {release['release']} | " + " | ".join(versions.get(n, "—") for n in PINNED_APART) + " |")
    lines += [
        "",
        "## Test results",
        "",
        "| transformers | default suite | common architectures (task heads) | sample of every modality |",
        "| --- | --- | --- | --- |",
    ]
    for release in releases:
        sweep = release.get("sweep") or {}
        architectures = sweep.get("architectures", {})
        clean = sum(_cell(result) in ("✓", "xfail") for result in architectures.values())
        swept_text = f"{clean} of {len(architectures)} as expected" if architectures else "—"
        sample = sweep.get("model_types", {})
        sample_text = (f"{sum(_outcome(r) == 'passed' for r in sample.values())} of {len(sample)} passed"
                       if sample else "—")
        lines.append(f"| {release['release']} | {_counts(release)} | {swept_text} | {sample_text} |")

    lines += ["", *render_torch(torch_data), *render_full_sweep(sweep_data), "## Common architectures, task heads", ""]
    lines += [
        "✓: gradient parity and the exact recomputed blocks, for full checkpointing and `every_n_layers=2`, through "
        "`hf_ckpt.enable` and through the patched `gradient_checkpointing_enable` (4 cases). ✗ k/4: only k of the 4 cases passed. "
        "xfail: a reviewed known failure (reason below), asserted to still fail. —: the release does not provide "
        "the architecture (reason below).",
        "",
    ]
    names = [r["release"] for r in swept]
    model_types: dict[str, dict] = {}
    for release in swept:
        for model_type, result in release["sweep"]["architectures"].items():
            model_types.setdefault(model_type, result)
    for task, title in TASK_TITLES.items():
        rows = sorted(m for m, result in model_types.items() if result["task"] == task)
        if not rows:
            continue
        lines += [f"### {title}", "", "| model type | class | " + " | ".join(names) + " |",
                  "| --- | --- | " + " | ".join("---" for _ in names) + " |"]
        for model_type in rows:
            cells = [_cell(r["sweep"]["architectures"].get(model_type)) for r in swept]
            lines.append(f"| `{model_type}` | `{model_types[model_type]['class']}` | " + " | ".join(cells) + " |")
        lines.append("")

    lines += _notes(swept)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", nargs="+", type=Path, default=[DEFAULT_INPUT], help="matrix JSON file(s)")
    parser.add_argument("--sweep", type=Path, default=None,
                        help=f"ci/sweep.py's JSON (default {DEFAULT_SWEEP.relative_to(ROOT)} if it exists)")
    parser.add_argument("--torch", type=Path, default=None,
                        help=f"ci/torch_range.py's JSON (CI: {DEFAULT_TORCH.relative_to(ROOT)}); without it, no torch section")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="the page to write (or --check)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; fail unless the run was green and --output is what it renders")
    args = parser.parse_args(argv)
    releases = load(args.input)
    if not any(r.get("sweep") for r in releases):
        print("no architecture sweep results in the input: run ci/matrix.py (with tests/test_architectures.py)")
        return 1
    sweep_path = args.sweep or (DEFAULT_SWEEP if DEFAULT_SWEEP.is_file() else None)
    sweep_data = json.loads(sweep_path.read_text()) if sweep_path else None
    torch_data = json.loads(args.torch.read_text()) if args.torch else None
    page = render(releases, sweep_data, torch_data)
    if not args.check:
        args.output.write_text(page)
        print(f"wrote {args.output} ({len(releases)} releases)")
        return 0
    return check(page, args.output, releases, sweep_data, torch_data)


def _stable(text: str) -> list[str]:
    return [line for line in text.splitlines() if MEASURED not in line]


def check(page: str, path: Path, releases: list[dict], sweep_data: dict | None, torch_data: dict | None = None) -> int:
    """0 if the run was green and ``path`` holds ``page`` (up to measured lines); else 1, saying why."""
    import difflib

    problems = [f"transformers {r['release']}: {_counts(r)}" for r in releases if _counts(r) != "green"]
    problems += [f"sweep {r['release']}: not ok" for r in (sweep_data or {}).get("releases", []) if not r.get("ok")]
    problems += [f"torch {e['torch']} (transformers {e['release']}): {_counts(e)}"
                 for e in (torch_data or {}).get("ends", []) if _counts(e) != "green"]
    committed = path.read_text() if path.is_file() else ""
    diff = list(difflib.unified_diff(_stable(committed), _stable(page), str(path), "this run", lineterm="", n=1))
    if diff:
        problems.append(f"{path} is not what this run gives: regenerate it with `python ci/compat_report.py`")
    for problem in problems:
        print(problem)
    if diff:
        print("\n".join(diff[:80]))
    if not problems:
        print(f"{path} is what this run gives")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
