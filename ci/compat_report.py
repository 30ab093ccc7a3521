#!/usr/bin/env python3
"""Write docs/compatibility.md from what the release matrix and the architecture sweep measured.

    python ci/matrix.py                 # writes build/matrix/matrix.json
    python ci/compat_report.py          # reads it, writes docs/compatibility.md

Several inputs can be given (``--input a.json b.json``); a release found in more than one comes from the last.
Everything on the page comes from the JSON: the upstream capabilities were detected in each release's own
environment (by capability, never by version string), the results are those the tests measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INPUT = ROOT / "build" / "matrix" / "matrix.json"
DEFAULT_OUTPUT = ROOT / "docs" / "compatibility.md"

PINNED_APART = ("torch", "huggingface_hub", "tokenizers", "peft")
VARIANTS = ("enable-every1", "enable-every2", "mixin-every1", "mixin-every2")
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
    failed = release["failed"] + release["errors"]
    text = f"{release['passed']} passed, {failed} failed"
    for key in ("xfailed", "skipped"):
        if release.get(key):
            text += f", {release[key]} {key}"
    if release.get("problem"):
        text += f" ({release['problem']})"
    return text


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


def render(releases: list[dict]) -> str:
    swept = [r for r in releases if r.get("sweep")]
    lines = [
        "# Compatibility",
        "",
        "<!-- Generated by `python ci/compat_report.py` from the JSON `python ci/matrix.py` writes. Do not edit. -->",
        "",
        "hf_ckpt is tested on every transformers release below, each in its own environment (torch "
        + ", ".join(sorted({r["sweep"]["torch"] for r in swept})) + ", CPU, fp32). "
        "The whole test suite runs on each; the architecture sweep (`tests/test_architectures.py`) trains a tiny "
        "model of every common architecture the release provides for one step, with and without checkpointing, "
        "and checks that the gradients agree (max abs difference <= 1e-5) and that exactly the selected blocks "
        "were recomputed, measured by counting block runs.",
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
        "| transformers | test suite | architectures swept | sweep runtime |",
        "| --- | --- | --- | --- |",
    ]
    for release in releases:
        sweep = release.get("sweep") or {}
        architectures = sweep.get("architectures", {})
        clean = sum(_cell(result) in ("✓", "xfail") for result in architectures.values())
        runtime = f"{sweep['sweep_seconds']:.0f} s" if "sweep_seconds" in sweep else "—"
        swept_text = f"{clean} of {len(architectures)} as expected" if architectures else "—"
        lines.append(f"| {release['release']} | {_counts(release)} | {swept_text} | {runtime} |")

    lines += ["", "## Architectures", ""]
    lines += [
        "✓: gradient parity and the exact recomputed blocks, for full checkpointing and `every_n_layers=2`, through "
        "`hf_ckpt.enable` and through `GradientCheckpointingMixin` (4 cases). ✗ k/4: only k of the 4 cases passed. "
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
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="the page to write")
    args = parser.parse_args(argv)
    releases = load(args.input)
    if not any(r.get("sweep") for r in releases):
        print("no architecture sweep results in the input: run ci/matrix.py (with tests/test_architectures.py)")
        return 1
    args.output.write_text(render(releases))
    print(f"wrote {args.output} ({len(releases)} releases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
