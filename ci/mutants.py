"""Prove that the suite guards every promised behaviour: break each one, and require a failing test.

Each mutant names a file, an exact source snippet that must stand in it once, and the snippet's replacement (the
promised behaviour deleted or bent). The script checks every snippet first and stops with status 2, naming the
mutant, when one no longer matches: a refactor must update this list, it cannot make a mutant silently vanish.

Then, one mutant at a time in each copy of the repository (``--jobs`` copies of the working tree as it is,
untracked files included; this checkout is never touched): apply it, run the suite fail-fast with ``python -m
pytest -x -q -p no:cacheprovider -m "slow or not slow"`` (the default run and the slow tests, as CI runs them) and
require a failure from the tests the mutant names as its killers (``first``): a mutant those tests miss survives,
so that the check stays short (one mutant that escaped its named tests once cost CI 25 minutes of the whole suite) and
each promise names the test that guards it. ``--whole-suite`` runs the rest of the suite after them (the two runs
together are the whole suite), to find the killer of a new mutant. It prints ``mutant | killed by <test id> |
seconds`` and exits 1 when any mutant survives.

    python ci/mutants.py                 # every mutant
    python ci/mutants.py --jobs 2        # two at a time, each in its own copy (CI runs one at a time, beside
                                         # the slow tests)
    python ci/mutants.py --list          # names only
    python ci/mutants.py --whole-suite new_mutant   # its named tests, then the rest of the suite
    python ci/mutants.py every_n_off_by_one warn_every_time
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The whole suite, the slow tests too (pyproject.toml leaves them out of the default run).
PYTEST = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow"]


@dataclass(frozen=True)
class Mutant:
    """One promised behaviour, deleted.

    Attributes:
        name: Short identifier (command-line selection, the table).
        promise: The behaviour users rely on that the mutant breaks.
        path: File to mutate, relative to the repository root.
        old: Exact snippet that must occur exactly once in ``path``.
        new: What replaces it.
        first: Test files (or test ids, ``file::test``) run first, the likely killers; the rest of the suite runs
            after them.
    """

    name: str
    promise: str
    path: str
    old: str
    new: str
    first: tuple[str, ...]


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "no_grad_flags_not_lent",
        "a no-grad forward (evaluation, generate) that turns the stacks' flags off for itself leaves the record current",
        "hf_ckpt/runtime/state.py",
        "now is False and self.lent[id(module)]",
        "now is False and False",
        ("tests/test_training_run.py::test_reading_the_setting_inside_a_no_grad_forward_keeps_it",),
    ),
    Mutant(
        "stale_record_silent",
        "a record changed behind hf_ckpt's back is dropped with one warning that names what changed",
        "hf_ckpt/runtime/state.py",
        "        warn_stale(target, state)\n        clear_state(target)\n",
        "        clear_state(target)\n",
        ("tests/test_direct_blocks.py", "tests/test_reliability.py"),
    ),
    Mutant(
        "probe_reports_a_replaced_setting",
        "a setting replaced behind hf_ckpt's back before its first step is named as changed, not measured as failing",
        "hf_ckpt/runtime/probe.py",
        "        if self.stale is not None and self.stale():\n",
        "        if False:  # mutant: the probe reports on a replaced setting\n",
        ("tests/test_measured_recompute.py::"
         "test_a_setting_replaced_before_its_first_step_is_named_as_changed_not_measured_as_failing",),
    ),
    Mutant(
        "head_hook_not_innermost",
        "the chunked head's forward hook runs first, so every other hook sees the output with its loss",
        "hf_ckpt/runtime/head.py",
        "always_call=True, prepend=True)",
        "always_call=True)",
        ("tests/test_training_run.py",),
    ),
    Mutant(
        "head_silent_without_labels",
        "a training forward without labels while the head is chunked warns that the head does not take effect",
        "hf_ckpt/runtime/head.py",
        "        else:\n            warn_once(f\"head_chunk_size={size} does not take effect in a training forward",
        "        elif False:\n            warn_once(f\"head_chunk_size={size} does not take effect in a training forward",
        ("tests/test_head.py", "tests/test_training_run.py"),
    ),
    Mutant(
        "trl_fused_head_not_recognised",
        "head_chunk_size is refused by name where TRL's fused LM head replaced the model's forward",
        "hf_ckpt/runtime/head.py",
        '("trl", "_fused_forward"): (',
        '("trl", "_fused_forward_"): (',
        ("tests/test_head.py",),
    ),
    Mutant(
        "undo_removes_later_wrappers",
        "undoing a wrapped forward never removes a wrapper another library put on since",
        "hf_ckpt/runtime/stacks/wrapping.py",
        "        if module.__dict__.get(\"forward\") is not wrapper:\n            return",
        "        if False:\n            return",
        ("tests/test_direct_blocks.py",),
    ),
    Mutant(
        "estimate_token_labels_for_every_head",
        "the estimate gives a sequence classifier one label per sequence (token labels crashed it, issue 45)",
        "hf_ckpt/estimation/_labels.py",
        '    if name.endswith("ForSequenceClassification"):\n',
        "    if False:  # mutant: token labels for every head\n",
        ("tests/test_estimate_heads.py",),
    ),
    Mutant(
        "estimate_plan_line_bound_for_uniform_plans",
        "the estimate's plan line gives the table's figures for a setting the table has (one figure per setting)",
        "hf_ckpt/estimation/_plan.py",
        "    if len(kinds) != 1:\n        return None\n",
        "    if True:  # mutant: always the solver's bound\n        return None\n",
        ("tests/test_estimate_plan_line.py",),
    ),
    Mutant(
        "estimate_gradients_whole_through_backward",
        "the estimate's step is a timeline: gradients appear as the activations are freed, states from the first step",
        "hf_ckpt/estimation/_timeline.py",
        "    if states.sharded is not None or backward is None or accumulation > 1:\n",
        "    if True:  # mutant: every gradient and the states through backward, the sum of worst moments\n",
        ("tests/test_estimate_timeline.py",),
    ),
    Mutant(
        "optimizer_step_without_temporaries",
        "the optimizer step counts its temporaries (torch's single-tensor AdamW on the CPU: three parameters' worth)",
        "hf_ckpt/meters/optimizer_step.py",
        "    return max(_chained(group, lambda p: 2 * _bytes(p), _bytes) for group in _trainer_groups(parameters))\n",
        "    return 0  # mutant: no temporaries\n",
        ("tests/test_optimizer_step.py",),
    ),
    Mutant(
        "estimate_fused_adamw_step_on_host",
        "adamw_torch_fused's step counters are device memory (the Trainer's fused AdamW), counted per parameter",
        "hf_ckpt/meters/optimizer_states.py",
        '    "adamw_torch_fused": TrainerOptimizer(torch.optim.AdamW, {"fused": True}),\n',
        '    "adamw_torch_fused": TrainerOptimizer(torch.optim.AdamW),  # mutant: fused ignored\n',
        ("tests/test_estimate_optimizers.py",),
    ),
    Mutant(
        "mlp_chunks_skip_norms",
        "mlp_chunk_size runs each block's norms in chunks too, so their float32 intermediates are a chunk's",
        "hf_ckpt/runtime/mlp_chunks.py",
        " + [(norm, False) for norm in norms(target)]:",
        ":  # mutant: the norms run whole",
        ("tests/test_mlp_chunks.py::test_the_blocks_norms_run_in_chunks_too_and_the_final_norm_whole",),
    ),
    Mutant(
        "offload_copy_back_is_the_host_copy",
        "on a CPU standing in for the accelerator, an offloaded input comes back as a new tensor, as on a GPU",
        "hf_ckpt/runtime/offload.py",
        "non_blocking=self.pin_memory, copy=True)",
        "non_blocking=self.pin_memory)",
        ("tests/test_offload.py::test_on_cpu_the_host_copies_count_apart_and_two_inputs_come_back_at_once",),
    ),
    Mutant(
        "head_chunks_ignore_num_items",
        "the chunked head divides the loss by num_items_in_batch when given (the Trainer's gradient accumulation)",
        "hf_ckpt/runtime/head.py",
        "count = (shifted != ignore).sum() if count is None else count",
        "count = (shifted != ignore).sum()",
        ("tests/test_head.py",),
    ),
    Mutant(
        "head_chunk_refusal_skipped",
        "head_chunk_size is refused at the call on a model whose forward changes its logits or loss",
        "hf_ckpt/runtime/apply.py",
        "    if refused and not pending:\n",
        "    if False:  # mutant: never refused\n",
        ("tests/test_head.py",),
    ),
    Mutant(
        "mixin_new_names_removed",
        "the mixin provides activation_checkpointing_enable/disable where transformers has them (>= 5.23)",
        "hf_ckpt/mixin.py",
        "if not has_activation_checkpointing_names():\n"
        "    # Before transformers 5.23 the new names do not exist upstream; the mixin does not invent them.\n",
        "if True:  # mutant: the new names are never provided\n",
        ("tests/test_mixin.py",),
    ),
    Mutant(
        "use_reentrant_default_true",
        "use_reentrant defaults to False",
        "hf_ckpt/runtime/config.py",
        'checked.setdefault("use_reentrant", False)',
        'checked.setdefault("use_reentrant", True)',
        ("tests/test_enable.py",),
    ),
    Mutant(
        "use_reentrant_not_passed",
        "use_reentrant is always passed to torch.utils.checkpoint.checkpoint explicitly",
        "hf_ckpt/runtime/functions.py",
        "return functools.partial(checkpoint, **checkpoint_kwargs)",
        'return functools.partial(checkpoint, **{k: v for k, v in checkpoint_kwargs.items() if k != "use_reentrant"})',
        ("tests/test_enable.py",),
    ),
    Mutant(
        "warn_every_time",
        "a setting that cannot take effect warns once (per model, or per process)",
        "hf_ckpt/runtime/util/warn.py",
        "    if key in seen:\n        return False\n",
        "    if False:  # mutant: warn every time\n        return False\n",
        ("tests/test_use_cache.py", "tests/test_measured_recompute.py"),
    ),
    Mutant(
        "every_n_off_by_one",
        "every_n_layers=n checkpoints blocks 0, n, 2n, ...",
        "hf_ckpt/runtime/selection.py",
        "return list(range(0, num_blocks, every_n_layers))",
        "return list(range(1, num_blocks, every_n_layers))",
        ("tests/test_enable.py",),
    ),
    Mutant(
        "every_n_selects_every_block",
        "every_n_layers=n checkpoints blocks 0, n, 2n, ... (not every block)",
        "hf_ckpt/runtime/selection.py",
        "return list(range(0, num_blocks, every_n_layers))",
        "return list(range(num_blocks))",
        ("tests/test_enable.py",),
    ),
    Mutant(
        "disable_restore_skipped",
        "disable restores what the model had before enable (upstream's setting included)",
        "hf_ckpt/runtime/state.py",
        "    clear_state(target)\n    state.before.restore()\n",
        "    clear_state(target)\n",
        ("tests/test_disable.py",),
    ),
    Mutant(
        "input_grads_hook_missing",
        "input grads are turned on where the recompute needs them (reentrant, PEFT adapters)",
        "hf_ckpt/runtime/hooks.py",
        'hooks.add(module, "register_forward_hook", _mark_output_requires_grad)',
        "pass  # mutant: no input-grads hook",
        ("tests/test_peft.py", "tests/test_enable.py"),
    ),
    Mutant(
        "probe_never_warns",
        "the first training step measures what was recomputed and warns when it differs from the selection",
        "hf_ckpt/runtime/probe.py",
        "        if measured != self.expected:\n",
        "        if False:  # mutant: the probe never warns\n",
        ("tests/test_measured_recompute.py",),
    ),
    Mutant(
        "failed_enable_changes_setting",
        "an enable call that raises changes nothing (the previous setting stays)",
        "hf_ckpt/runtime/apply.py",
        "    binding = None if pending else resolve(target, config)  # everything that can fail on this model fails here\n",
        "    take_back(target)  # mutant: the old setting is undone before the new one is checked\n"
        "    binding = None if pending else resolve(target, config)\n",
        ("tests/test_selection.py",),
    ),
    Mutant(
        "use_cache_left_on",
        "use_cache is turned off in training steps with checkpointing",
        "hf_ckpt/runtime/hooks.py",
        '    kwargs["use_cache"] = False\n    return args, kwargs\n',
        "    return None  # mutant: use_cache left as it is\n",
        ("tests/test_use_cache.py",),
    ),
    Mutant(
        "no_grad_still_checkpoints",
        "under torch.no_grad the model runs exactly as without checkpointing",
        "hf_ckpt/runtime/hooks.py",
        "    if torch.is_grad_enabled():\n        return\n    saved.append(",
        "    if True:  # mutant: flags stay on under no_grad\n        return\n    saved.append(",
        ("tests/test_enable.py::test_a_no_grad_forward_in_training_mode_checkpoints_nothing",),
    ),
    Mutant(
        "outside_outputs_kept",
        "a plan's outside_blocks: tensors saved from those modules' outputs are recomputed, not kept",
        "hf_ckpt/strategies/outside/hook.py",
        "        return MadeAgain(functools.partial(call.output, index), tensor)\n",
        "        return tensor  # mutant: outputs of recomputed modules kept\n",
        ("tests/test_outside.py",),
    ),
    Mutant(
        "outside_sums_kept",
        "a sum of recomputed modules' outputs (GPT-2's embeddings) is made again from them, not kept",
        "hf_ckpt/strategies/outside/hook.py",
        "            return MadeAgain(made, tensor) if made is not None else boundary_pack(tensor)\n",
        "            return boundary_pack(tensor)  # mutant: sums of recomputed outputs kept\n",
        ("tests/test_outside.py",),
    ),
    Mutant(
        "plan_rounded",
        "the planners find the cheapest plan whose exact bytes fit, not only those a rounding to byte units sees",
        "hf_ckpt/solver/knapsack.py",
        "                gain = state.gain + choice.gain if cap is None else min(cap, state.gain + choice.gain)\n",
        "                gain = (state.gain + choice.gain) // unit * unit  # mutant: savings rounded to a byte unit\n",
        ("tests/test_solver.py",),
    ),
    Mutant(
        "ties_to_earlier_blocks",
        "between plans of equal total, the later blocks take the options that save more (the plans' tie order)",
        "hf_ckpt/solver/knapsack.py",
        "                order = (-choice.gain,) + state.order\n",
        "                order = (choice.gain,) + state.order  # mutant: ties to earlier blocks\n",
        ("tests/test_solver.py",),
    ),
    Mutant(
        "boundary_outputs_kept",
        "a partitioned block's output made from what it saves is not kept by its consumers",
        "hf_ckpt/strategies/partition/boundary.py",
        "    return MadeAgain(call.made, tensor)\n",
        "    return tensor  # mutant: block outputs kept\n",
        ("tests/test_boundary.py",),
    ),
    Mutant(
        "outside_dropout_redrawn",
        "a recomputed dropout draws its mask again from the RNG state of its forward",
        "hf_ckpt/strategies/outside/hook.py",
        "        set_rng_state(device, state)\n",
        "        pass  # mutant: dropout redrawn from the current RNG state\n",
        ("tests/test_outside.py",),
    ),
    Mutant(
        "norms_banned",
        "partition:<F>:norms lets the partitioner recompute norms and softmaxes",
        "hf_ckpt/runtime/_torch.py",
        "            types.recomputable_ops |= added\n",
        "            pass  # mutant: norms stay banned from recompute\n",
        ("tests/test_norms.py",),
    ),
    Mutant(
        "outside_leaves_only",
        "cheap_modules takes a module that holds others whole",
        "hf_ckpt/planning/menus/outside.py",
        "             if name and not any(id(d) in inside for d in m.modules())}\n",
        "             if name and not any(id(d) in inside for d in m.modules()) and not any(True for _ in m.children())}\n",
        ("tests/test_outside.py",),
    ),
    Mutant(
        "removed_hook_still_runs",
        "a hook removed within a forward does nothing for the rest of it (torch still calls it)",
        "hf_ckpt/runtime/state.py",
        "        return None if self.removed else self.__wrapped__(*args)\n",
        "        return self.__wrapped__(*args)\n",
        ("tests/test_budget_trainer.py::test_a_planned_budget_changed_by_upstreams_disable_gives_way_to_it_in_the_next_step",),
    ),
    Mutant(
        "budget_ignores_moved_weights",
        "a budget plans again when the weights moved to another dtype or device after its plan",
        "hf_ckpt/budget/deferred.py",
        "    if request.weights is not None and not request.weights.moved():\n",
        "    if request.weights is not None:  # mutant: weights read once\n",
        ("tests/test_budget_trainer.py::test_weights_moved_after_the_first_plan_are_planned_again_and_auto_read_again",),
    ),
    Mutant(
        "hard_coded_stack_flag_on",
        "a stack whose loop hard-codes torch's checkpoint keeps its flag off: only the selected blocks are recomputed",
        "hf_ckpt/runtime/binding.py",
        'put(module, "gradient_checkpointing", not (id(module) in owners and hard_codes_checkpoint(type(module))))',
        'put(module, "gradient_checkpointing", True)',
        ("tests/test_direct_blocks.py",),
    ),
    Mutant(
        "block_argument_ignored",
        "a block handed to the checkpoint function as an argument follows the selection (IDEFICS's vblock)",
        "hf_ckpt/runtime/functions.py",
        "    if choice is None:\n        choice = next(",
        "    if False:  # mutant: the arguments are never read\n        choice = next(",
        ("tests/test_measured_recompute.py",),
    ),
    Mutant(
        "timing_check_fails_on_noise",
        "hf-ckpt bench --check fails a timing check only when the whole 95% interval is over the limit",
        "hf_ckpt/measure/report.py",
        "    if interval.low > limit:\n        return FAIL\n",
        "    if interval.median > limit:  # mutant: the median alone decides, as before\n        return FAIL\n",
        ("tests/test_measure.py", "tests/test_cli.py"),
    ),
    Mutant(
        "inconclusive_fails_check",
        "an inconclusive timing check (noisy machine) does not make hf-ckpt bench --check exit 1",
        "hf_ckpt/measure/report.py",
        "                    verdict != FAIL,\n",
        "                    verdict == PASS,  # mutant: inconclusive counts as a failure\n",
        ("tests/test_cli.py",),
    ),
    Mutant(
        "bench_times_first_steps",
        "the bench times steps after the first, as a training run has them (the probe is not re-armed each round)",
        "hf_ckpt/measure/bench.py",
        "    if state is None or state.measured is None or state.undo:\n",
        "    if True:  # mutant: every round enables the setting afresh and times its first step\n",
        ("tests/test_measure.py",),
    ),
    Mutant(
        "rounds_rotated_only",
        "the bench's rounds balance what ran before each step (a Williams design), not only the positions",
        "hf_ckpt/measure/timing.py",
        "        for name in [names[i] for i in orders[round_index % len(orders)]]:\n",
        "        for name in names[round_index % len(names):] + names[:round_index % len(names)]:  # mutant: rotated\n",
        ("tests/test_measure.py",),
    ),
    Mutant(
        "probe_stays_in_record",
        "once the first step is measured, nothing of the probe stays on the model or in its record",
        "hf_ckpt/runtime/hooks.py",
        "    state.undo[:] = [action for action in state.undo if not _finished_probe(action)]\n",
        "",
        ("tests/test_measured_recompute.py",),
    ),
)


def check_snippets(root: Path, mutants: tuple[Mutant, ...]) -> list[str]:
    """Problems with the list: a snippet that does not occur exactly once, a ``first`` file that is missing."""
    problems = []
    for mutant in mutants:
        path = root / mutant.path
        if not path.is_file():
            problems.append(f"{mutant.name}: {mutant.path} does not exist")
            continue
        count = path.read_text().count(mutant.old)
        if count != 1:
            problems.append(
                f"{mutant.name}: the snippet occurs {count} times in {mutant.path} (exactly once is needed); "
                f"update ci/mutants.py to the code as it is now:\n{mutant.old}"
            )
        problems += [
            f"{mutant.name}: {first} does not exist"
            for first in mutant.first
            if not (root / first.partition("::")[0]).is_file()
        ]
    return problems


def _repository_files(root: Path) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, check=True, capture_output=True, text=True,
    ).stdout
    return [name for name in listed.split("\0") if name and (root / name).is_file()]


def copy_repository(root: Path, destination: Path) -> None:
    """The working tree as it is (tracked and untracked, not ignored files) into ``destination``."""
    for name in _repository_files(root):
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def _run_pytest(python: str, copy: Path, arguments: list[str], timeout: float) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    try:
        done = subprocess.run(
            [python, *PYTEST, *arguments], cwd=copy, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return -1, "timed out"
    return done.returncode, done.stdout + done.stderr


def run_mutant(
    mutant: Mutant, copy: Path, python: str, timeout: float, whole_suite: bool = False
) -> tuple[bool, str, float]:
    """Apply ``mutant`` in ``copy``, run its named tests fail-fast (then, with ``whole_suite``, the rest of the
    suite), restore the file.

    Returns whether a test failed, the failing test's id (or why none did) and the seconds taken."""
    path = copy / mutant.path
    original = path.read_text()
    path.write_text(original.replace(mutant.old, mutant.new, 1))
    started = time.perf_counter()
    try:
        rest = [f"--deselect={first}" if "::" in first else f"--ignore={first}" for first in mutant.first]
        for arguments in ([*mutant.first], rest) if whole_suite else ([*mutant.first],):
            status, output = _run_pytest(python, copy, arguments, timeout)
            if status == 5:  # pytest collected nothing there: no test ran, none failed
                continue
            if status == -1:
                return False, f"TIMED OUT after {timeout:g} s (pytest {' '.join(arguments)})", time.perf_counter() - started
            if status != 0:
                found = _FAILED.search(output)
                killer = found.group(1) if found else f"pytest exit status {status}: {output.strip()[-300:]}"
                return True, killer, time.perf_counter() - started
        verdict = "SURVIVED" if whole_suite else f"SURVIVED its named tests ({', '.join(mutant.first)})"
        return False, verdict, time.perf_counter() - started
    finally:
        path.write_text(original)


def run_all(
    chosen: tuple[Mutant, ...], python: str, timeout: float, jobs: int, whole_suite: bool = False
) -> list[Mutant]:
    """Run ``chosen``, ``jobs`` at a time, each job in its own copy of the repository; print a line per mutant as it
    ends; return the survivors, in ``chosen``'s order."""
    verdicts: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="hf_ckpt-mutants-") as temporary:
        copies: queue.Queue[Path] = queue.Queue()
        for index in range(min(jobs, len(chosen))):
            copy_repository(ROOT, Path(temporary) / str(index))
            copies.put(Path(temporary) / str(index))

        def one(mutant: Mutant) -> None:
            copy = copies.get()
            try:
                killed, verdict, seconds = run_mutant(mutant, copy, python, timeout, whole_suite)
            finally:
                copies.put(copy)
            print(f"{mutant.name:<32} | {verdict:<100} | {seconds:7.1f}", flush=True)
            verdicts[mutant.name] = killed

        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, chosen))
    return [mutant for mutant in chosen if not verdicts[mutant.name]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="print the mutants and what each breaks, then exit")
    parser.add_argument("--python", default=sys.executable, help="interpreter with the test dependencies")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one pytest run may take")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in its own copy (default 1)")
    parser.add_argument("--whole-suite", action="store_true",
                        help="where a mutant's named tests pass, run the rest of the suite too (finds a new killer)")
    args = parser.parse_args(argv)

    known = {mutant.name: mutant for mutant in MUTANTS}
    unknown = [name for name in args.names if name not in known]
    if unknown:
        parser.error(f"unknown mutant(s) {', '.join(unknown)}; known: {', '.join(known)}")
    chosen = tuple(known[name] for name in args.names) or MUTANTS
    if args.list:
        for mutant in chosen:
            print(f"{mutant.name}: {mutant.promise} ({mutant.path})")
        return 0
    problems = check_snippets(ROOT, chosen)
    if problems:
        print("ci/mutants.py: the mutant list no longer matches the code:", *problems, sep="\n  ", file=sys.stderr)
        return 2

    started = time.perf_counter()
    print(f"{'mutant':<32} | {'killed by':<100} | seconds", flush=True)
    survivors = run_all(chosen, args.python, args.timeout, max(1, args.jobs), args.whole_suite)
    print(f"{len(chosen) - len(survivors)}/{len(chosen)} mutants killed in {time.perf_counter() - started:.0f} s")
    for mutant in survivors:
        where = "the suite" if args.whole_suite else "its named tests"
        print(f"SURVIVED {mutant.name}: nothing in {where} fails when {mutant.promise} is broken")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
