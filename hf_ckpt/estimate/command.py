"""``hf-ckpt estimate``: will it fit? Training memory per checkpointing strategy, from a ``config.json``.

    hf-ckpt estimate path/to/config.json --batch 1 --seq 8192 --device-memory 80GiB --lora-r 16 --json est.json
    hf-ckpt estimate path/to/config.json --batch 1 --seq 8192 --world-size 8 --shard zero3 --device-memory 80GiB

The step estimated is the ``Trainer``'s (only the loss is held into backward); ``--keep-outputs`` estimates a loop
that keeps the model's outputs alive through backward instead (the JSON's ``keep_outputs`` says which). Prints
one row per strategy (activation memory, predicted peak, whether it fits, FLOPs ratio) and, with
``--device-memory``, the cheapest per-block plan whose whole step fits (``--plan-json`` saves it for
``hf_ckpt.enable(model, plan=...)``). ``--check`` instead runs a real CPU step of a tiny model of the same
architecture and compares it with the estimate. Exit status: 0, 1 when nothing fits (or the check fails), 2 for
bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os

from .._units import format_bytes, format_flops, parse_size
from ..cli.errors import CommandError

NAME = "estimate"
HELP = "will it fit? predicted training memory and recompute cost per checkpointing strategy, from a config"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``hf-ckpt estimate``'s options."""
    parser.add_argument("config", metavar="CONFIG", help="a config.json, or a folder holding one")
    parser.add_argument("--batch", type=int, required=True, help="sequences per step (per device)")
    parser.add_argument("--seq", type=int, required=True, help="tokens per sequence")
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16 (default), float16 or float32")
    parser.add_argument("--autocast", default=None, metavar="DTYPE",
                        help="mixed precision: forward under autocast to bfloat16 or float16, over --dtype weights "
                             "(the Trainer's bf16=True with float32 weights: --dtype float32 --autocast bf16)")
    parser.add_argument("--device", default="cuda", help="cuda (default; attention kernels modelled) or cpu")
    parser.add_argument("--optimizer", default="adamw", help="adamw (default), adam, sgd_momentum or sgd")
    parser.add_argument("--lora-r", type=int, default=None, metavar="R",
                        help="train LoRA adapters of rank R on every linear layer (peft), the base frozen")
    parser.add_argument("--strategies", default="none,full,every_n:2,selective",
                        help="comma-separated: none, full, selective, every_n:K (default %(default)s)")
    parser.add_argument("--keep-outputs", action="store_true",
                        help="estimate a loop that keeps the model's outputs (logits, ...) alive through backward "
                             "(outputs = model(**batch); backward(outputs.loss)); default: the Trainer's step, which "
                             "keeps only the loss")
    parser.add_argument("--world-size", type=int, default=1, metavar="N",
                        help="data-parallel devices the model's states are sharded over (default 1)")
    parser.add_argument("--shard", default="none",
                        help="none (default), fsdp-full, fsdp-grad-op, zero1, zero2 or zero3: per-device parameter, "
                             "gradient and optimizer bytes as FSDP2 / DeepSpeed hold them")
    parser.add_argument("--offload-optimizer", action="store_true",
                        help="DeepSpeed's offload_optimizer to the CPU (zero1, zero2, zero3)")
    parser.add_argument("--offload-parameters", action="store_true",
                        help="zero3's offload_param, or FSDP's CPUOffloadPolicy (parameters, gradients, optimizer step)")
    parser.add_argument("--device-memory", default=None, metavar="SIZE",
                        help="memory of one device (80GiB): marks what fits and prints the cheapest plan that fits")
    parser.add_argument("--json", metavar="PATH", help="write the estimate (and the plan) as JSON to PATH")
    parser.add_argument("--plan-json", metavar="PATH", help="with --device-memory: write the plan to PATH")
    parser.add_argument("--check", action="store_true",
                        help="compare the estimate with a real CPU step of a tiny model of this architecture")


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
            "offload_parameters": "--offload-parameters"}


def _option_names(message: str) -> str:
    """An estimate() error with its argument spelled as the command's option (``world_size`` -> ``--world-size``)."""
    for argument, option in _OPTIONS.items():
        if message.startswith(argument + " ") or message.startswith(argument + ":"):
            return option + message[len(argument):]
    return message


def _plan_line(plan, made) -> str:
    counts = {s: plan.strategies.count(s) for s in ("full", "selective", "none")}
    ratio = (made.step_flops["none"] + plan.predicted_recompute_flops) / made.step_flops["none"]
    peak = made.fixed_bytes + plan.predicted_bytes + max(made.transient_bytes.values())
    return (f"cheapest plan that fits: {counts['full']} full, {counts['selective']} selective, {counts['none']} none; "
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
        from ._check import run_check

        return run_check(args.config)

    from . import estimate, plan_from_estimate

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    try:
        made = estimate(args.config, batch_size=args.batch, seq_len=args.seq, dtype=args.dtype, autocast=args.autocast,
                        device=args.device, optimizer=args.optimizer, peft_config=_lora(args.lora_r), strategies=strategies,
                        keep_outputs=args.keep_outputs, world_size=args.world_size, shard=args.shard,
                        offload_optimizer=args.offload_optimizer, offload_parameters=args.offload_parameters)
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
