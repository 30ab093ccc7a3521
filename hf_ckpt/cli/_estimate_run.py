"""``hf-ckpt estimate``, run: the estimate printed (and written as JSON), the cheapest plan that fits, or
``--check`` (the parser is :mod:`hf_ckpt.cli.estimate`)."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from typing import Any

from hf_ckpt.runtime.units import format_bytes, format_flops, parse_size
from hf_ckpt.cli.errors import CommandError
from hf_ckpt.estimate._arguments import check_dtype
from hf_ckpt.strategies import ALL_STRATEGIES
from hf_ckpt.estimate._check import run_check
from hf_ckpt.estimate._estimate import CHUNKED_HEAD_ROW, EVERY_BLOCK_ROW, estimate
from hf_ckpt.estimate._max_seq import DEVICE_FLOPS, copies_line, copy_and_compute_seconds, max_seq
from hf_ckpt.estimate._plan import plan_from_estimate, plan_peak


def _folder_exists(option: str, path: str | None) -> None:
    if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise CommandError(f"{option}: the folder of {path!r} does not exist")


def _names(option: str, value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise CommandError(f"{option} must name at least one module (comma-separated); got {value!r}")
    return names


def _lora(args: argparse.Namespace):
    """The ``LoraConfig`` the ``--lora-*`` flags describe, or None without ``--lora-r``."""
    rank = args.lora_r
    given = [option for option, value in (("--lora-targets", args.lora_targets), ("--lora-alpha", args.lora_alpha),
                                          ("--lora-dropout", args.lora_dropout),
                                          ("--lora-modules-to-save", args.lora_modules_to_save)) if value is not None]
    if rank is None:
        if given:
            raise CommandError(f"{given[0]} needs --lora-r")
        return None
    if rank < 1:
        raise CommandError(f"--lora-r must be a positive int; got {rank}")
    dropout = 0.0 if args.lora_dropout is None else args.lora_dropout
    if not 0.0 <= dropout < 1.0:
        raise CommandError(f"--lora-dropout must be at least 0 and below 1; got {args.lora_dropout}")
    targets = _names("--lora-targets", args.lora_targets)
    try:
        from peft import LoraConfig
    except ImportError:
        raise CommandError("--lora-r needs the peft package (pip install peft)") from None
    return LoraConfig(r=rank, lora_alpha=2 * rank if args.lora_alpha is None else args.lora_alpha,
                      target_modules=targets if targets is not None and targets != ["all-linear"] else "all-linear",
                      lora_dropout=dropout, modules_to_save=_names("--lora-modules-to-save", args.lora_modules_to_save))


def _quantization(args: argparse.Namespace):
    """The ``BitsAndBytesConfig`` the ``--quantize`` flags describe, or None."""
    four_bit_only = [option for option, given in (("--quant-type", args.quant_type is not None),
                                                   ("--double-quant", args.double_quant),
                                                   ("--quant-compute-dtype", args.quant_compute_dtype is not None))
                     if given]
    if args.quantize is None:
        if four_bit_only:
            raise CommandError(f"{four_bit_only[0]} needs --quantize 4bit")
        return None
    if args.quantize not in ("4bit", "8bit"):
        raise CommandError(f"--quantize must be 4bit or 8bit; got {args.quantize!r}")
    if args.quantize == "8bit":
        if four_bit_only:
            raise CommandError(f"{four_bit_only[0]} applies to --quantize 4bit only")
        return _bitsandbytes_config(load_in_8bit=True)
    quant_type = args.quant_type or "nf4"
    if quant_type not in ("nf4", "fp4"):
        raise CommandError(f"--quant-type must be nf4 or fp4; got {quant_type!r}")
    try:
        compute = check_dtype(args.quant_compute_dtype or args.autocast or args.dtype)
    except ValueError as error:
        option = "--quant-compute-dtype" if args.quant_compute_dtype else "--autocast" if args.autocast else "--dtype"
        raise CommandError(f"{option}: {error}") from None
    return _bitsandbytes_config(load_in_4bit=True, bnb_4bit_quant_type=quant_type,
                                bnb_4bit_use_double_quant=args.double_quant, bnb_4bit_compute_dtype=compute)


def _bitsandbytes_config(**options: Any) -> Any:
    """``transformers.BitsAndBytesConfig(**options)``; before transformers 5 its checks read bitsandbytes' version, so
    there it needs bitsandbytes installed (the estimate itself does not)."""
    from importlib.metadata import PackageNotFoundError

    from transformers import BitsAndBytesConfig

    try:
        return BitsAndBytesConfig(**options)
    except PackageNotFoundError:
        raise CommandError("--quantize: this transformers release's BitsAndBytesConfig needs bitsandbytes installed "
                           "(pip install bitsandbytes); the estimate itself loads none of it") from None


_OPTIONS = {"world_size": "--world-size", "shard": "--shard", "offload_optimizer": "--offload-optimizer",
            "head_chunk_size": "--head-chunk-size", "quantization_config": "--quantize",
            "attn_implementation": "--attn", "mlp_chunk_size": "--mlp-chunk-size",
            "host_memory": "--host-memory", "device_memory": "--device-memory", "pcie_bandwidth": "--pcie-bandwidth",
            "offload_parameters": "--offload-parameters", "fsdp_param_dtype": "--fsdp-param-dtype",
            "gradient_accumulation_steps": "--gradient-accumulation-steps"}


def _option_names(message: str) -> str:
    """An estimate() error with its argument spelled as the command's option (``world_size`` -> ``--world-size``)."""
    if message.startswith("peft_config: "):  # peft refused the adapters the --lora-* flags describe
        option = "--lora-targets" if "target" in message.lower() else "--lora-modules-to-save" \
            if "modules_to_save" in message else "--lora-r"
        return option + message[len("peft_config"):]
    for argument, option in _OPTIONS.items():
        if message.startswith(argument + " ") or message.startswith(argument + ":"):
            return option + message[len(argument):]
    return message


def _row_of(plan, made) -> str | None:
    """The table's row for the same setting as ``plan``: every block on one strategy (and the head as the row's)."""
    kinds = set(plan.strategies)
    if len(kinds) != 1:
        return None
    (kind,) = kinds
    if plan.head_chunk_size is not None:
        kind = f"{CHUNKED_HEAD_ROW}{plan.head_chunk_size}" if kind == EVERY_BLOCK_ROW else ""
    return kind if kind in made.activation_bytes else None


def _plan_line(plan, made) -> str:
    """The plan's figures: its table row's where the table has the same setting (one figure per setting), else the
    solver's, each block counted at its largest whatever its neighbours run, as the line says."""
    counts = {s: plan.strategies.count(s) for s in ALL_STRATEGIES}
    head = "" if plan.head_chunk_size is None else f", head in chunks of {plan.head_chunk_size} tokens"
    row = _row_of(plan, made)
    if row is not None:
        activations, peak = made.activation_bytes[row], made.peak_bytes[row]
        recompute, ratio, source = made.recompute_flops[row], made.flops_ratio[row], f" (the table's row {row})"
    else:
        activations, recompute = plan.predicted_bytes, plan.predicted_recompute_flops
        ratio = (made.step_flops["none"] + recompute) / made.step_flops["none"]
        peak = plan_peak(made, activations, plan.head_chunk_size or False)
        source = " (activations: each block at its most, whatever its neighbours run)"
    return (f"cheapest plan that fits: {counts['full']} full, {counts['selective']} selective, {counts['none']} none"
            f"{head}; "
            f"activations {format_bytes(activations)}, peak {format_bytes(peak)}"
            f"{' per device' if made.shard != 'none' else ''}, recompute {format_flops(recompute)}"
            f", FLOPs ratio {ratio:.3f}x{source}")


def _max_seq(args: argparse.Namespace, device_memory: int | None, quantization: Any) -> int:
    """``--max-seq``: the longest sequence that fits, printed (and written as JSON); 1 when nothing fits."""
    if device_memory is None:
        raise CommandError("--max-seq needs --device-memory (the memory the step must fit)")
    if args.seq is not None:
        raise CommandError("--max-seq searches for the sequence length itself; drop --seq")
    if args.check or args.plan_json is not None:
        raise CommandError("--max-seq cannot be combined with --check or --plan-json; drop them")
    try:
        found = max_seq(args.config, device_memory=device_memory, batch_size=args.batch, host_memory=args.host_memory,
                        head_chunk_size=args.head_chunk_size, mlp_chunk_size=args.mlp_chunk_size,
                        pcie_bandwidth=args.pcie_bandwidth * 1e9, dtype=args.dtype, autocast=args.autocast,
                        device=args.device, optimizer=args.optimizer, peft_config=_lora(args),
                        keep_outputs=args.keep_outputs, world_size=args.world_size, shard=args.shard,
                        offload_optimizer=args.offload_optimizer, offload_parameters=args.offload_parameters,
                        fsdp_param_dtype=args.fsdp_param_dtype,
                        quantization_config=quantization, attn_implementation=args.attn)
    except (ValueError, FileNotFoundError) as error:
        raise CommandError(_option_names(str(error))) from None
    print(found)
    if args.json is not None:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(asdict(found), handle, indent=2)
            handle.write("\n")
        print(f"result written to {args.json}")
    return 0 if found.seq_len else 1


def _device_memory(args: argparse.Namespace) -> int | None:
    """``--device-memory`` in bytes (None: not given), checked with the options that need it."""
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
    return device_memory


def _refuse_combinations(args: argparse.Namespace, quantization: Any) -> None:
    """The options that cannot go together, each refused naming the one to drop."""
    if args.check and args.keep_outputs:
        raise CommandError("--keep-outputs: --check compares the Trainer's step (outputs dropped) only; drop one")
    if args.check and quantization is not None:
        raise CommandError("--quantize: --check compares an unquantized step (bitsandbytes is not needed); drop one")
    if args.check and args.offload:
        raise CommandError("--offload: --check compares a step without offload (there is no accelerator to offload "
                           "from); drop one")
    if args.max_seq and args.offload:
        raise CommandError("--offload: --max-seq offloads the checkpointed inputs where --host-memory is given; drop "
                           "--offload")


def run(args: argparse.Namespace) -> int:
    """Run ``hf-ckpt estimate``; returns the exit status."""
    device_memory = _device_memory(args)
    quantization = _quantization(args)
    _refuse_combinations(args, quantization)
    if args.check:
        return run_check(args.config)
    if args.max_seq:
        return _max_seq(args, device_memory, quantization)
    if args.seq is None:
        raise CommandError("--seq is required (tokens per sequence), but with --max-seq")
    if args.host_memory is not None:
        raise CommandError("--host-memory only applies with --max-seq; drop it or add --max-seq")
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    try:
        made = estimate(args.config, batch_size=args.batch, seq_len=args.seq, dtype=args.dtype, autocast=args.autocast,
                        device=args.device, optimizer=args.optimizer, peft_config=_lora(args), strategies=strategies,
                        keep_outputs=args.keep_outputs, world_size=args.world_size, shard=args.shard,
                        offload_optimizer=args.offload_optimizer, offload_parameters=args.offload_parameters,
                        fsdp_param_dtype=args.fsdp_param_dtype,
                        head_chunk_size=args.head_chunk_size, quantization_config=quantization,
                        attn_implementation=args.attn, mlp_chunk_size=args.mlp_chunk_size,
                        offload_activations=args.offload,
                        gradient_accumulation_steps=args.gradient_accumulation_steps)
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
    if made.activation_host_bytes and made.device == "cuda":
        print(copies_line(*copy_and_compute_seconds(made, args.pcie_bandwidth * 1e9), args.pcie_bandwidth * 1e9,
                          DEVICE_FLOPS))
    if made.attention.get("modelled"):
        print(f"note: {made.attention['note']}")
    if args.json is not None:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
            handle.write("\n")
        print(f"estimate written to {args.json}")
    return status
