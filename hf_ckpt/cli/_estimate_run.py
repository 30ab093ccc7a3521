"""``hf-ckpt estimate``, run: the estimate printed (and written as JSON), the cheapest plan that fits, or
``--check`` (the parser is :mod:`hf_ckpt.cli.estimate`)."""

from __future__ import annotations

import argparse
import json
import os

from hf_ckpt.runtime.units import format_bytes, format_flops, parse_size
from hf_ckpt.cli.errors import CommandError
from hf_ckpt.strategies import ALL_STRATEGIES
from hf_ckpt.estimate._check import run_check
from hf_ckpt.estimate._estimate import estimate
from hf_ckpt.estimate._plan import plan_from_estimate, step_transient


def _folder_exists(option: str, path: str | None) -> None:
    if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise CommandError(f"{option}: the folder of {path!r} does not exist")


def _lora(rank: int | None):
    if rank is None:
        return None
    if rank < 1:
        raise CommandError(f"--lora-r must be a positive int; got {rank}")
    try:
        from peft import LoraConfig
    except ImportError:
        raise CommandError("--lora-r needs the peft package (pip install peft)") from None
    return LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", lora_dropout=0.0)


_OPTIONS = {"world_size": "--world-size", "shard": "--shard", "offload_optimizer": "--offload-optimizer",
            "head_chunk_size": "--head-chunk-size",
            "offload_parameters": "--offload-parameters"}


def _option_names(message: str) -> str:
    """An estimate() error with its argument spelled as the command's option (``world_size`` -> ``--world-size``)."""
    for argument, option in _OPTIONS.items():
        if message.startswith(argument + " ") or message.startswith(argument + ":"):
            return option + message[len(argument):]
    return message


def _plan_line(plan, made) -> str:
    counts = {s: plan.strategies.count(s) for s in ALL_STRATEGIES}
    ratio = (made.step_flops["none"] + plan.predicted_recompute_flops) / made.step_flops["none"]
    peak = made.fixed_bytes + plan.predicted_bytes + step_transient(made, plan.head_chunk_size or False)
    head = "" if plan.head_chunk_size is None else f", head in chunks of {plan.head_chunk_size} tokens"
    return (f"cheapest plan that fits: {counts['full']} full, {counts['selective']} selective, {counts['none']} none"
            f"{head}; "
            f"activations {format_bytes(plan.predicted_bytes)}, peak {format_bytes(peak)}"
            f"{' per device' if made.shard != 'none' else ''}, recompute {format_flops(plan.predicted_recompute_flops)}"
            f", FLOPs ratio {ratio:.3f}x")


def run(args: argparse.Namespace) -> int:
    """Run ``hf-ckpt estimate``; returns the exit status."""
    _folder_exists("--json", args.json)
    _folder_exists("--plan-json", args.plan_json)
    device_memory = None
    if args.device_memory is not None:
        try:
            device_memory = parse_size(args.device_memory)
        except ValueError as error:
            raise CommandError(f"--device-memory: {error}") from None
    if args.plan_json is not None and device_memory is None:
        raise CommandError("--plan-json needs --device-memory (the plan is the cheapest that fits it)")
    if args.check and args.keep_outputs:
        raise CommandError("--keep-outputs: --check compares the Trainer's step (outputs dropped) only; drop one")
    if args.check:
        return run_check(args.config)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    try:
        made = estimate(args.config, batch_size=args.batch, seq_len=args.seq, dtype=args.dtype, autocast=args.autocast,
                        device=args.device, optimizer=args.optimizer, peft_config=_lora(args.lora_r), strategies=strategies,
                        keep_outputs=args.keep_outputs, world_size=args.world_size, shard=args.shard,
                        offload_optimizer=args.offload_optimizer, offload_parameters=args.offload_parameters,
                        head_chunk_size=args.head_chunk_size)
    except (ValueError, FileNotFoundError) as error:
        raise CommandError(_option_names(str(error))) from None
    print(str(made).rsplit("\n", 1 + len(made.activation_bytes) + 1)[0])
    print(made.table(device_memory))
    if device_memory is not None:
        print(f"device memory {format_bytes(device_memory)}: "
              f"{', '.join(n for n, ok in made.fits(device_memory).items() if ok) or 'no strategy'} fits")
    data = made.to_dict()
    status = 0
    if device_memory is not None:
        data["device_memory_bytes"] = device_memory
        data["fits"] = made.fits(device_memory)
        try:
            plan = plan_from_estimate(made, device_memory, whole_step=True)
        except ValueError as error:
            print(str(error))
            data["plan"] = None
            status = 1
        else:
            print(_plan_line(plan, made))
            data["plan"] = plan.to_dict()
            if args.plan_json is not None:
                plan.save(args.plan_json)
                print(f"plan written to {args.plan_json}")
    if made.attention.get("modelled"):
        print(f"note: {made.attention['note']}")
    if args.json is not None:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
            handle.write("\n")
        print(f"estimate written to {args.json}")
    return status
