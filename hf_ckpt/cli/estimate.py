"""``hf-ckpt estimate``: will it fit? Training memory per checkpointing strategy, from a ``config.json``.

    hf-ckpt estimate path/to/config.json --batch 1 --seq 8192 --device-memory 80GiB --lora-r 16 --json est.json
    hf-ckpt estimate path/to/config.json --batch 1 --seq 8192 --world-size 8 --shard zero3 --device-memory 80GiB

The step estimated is the ``Trainer``'s (only the loss is held into backward); ``--keep-outputs`` estimates a loop
that keeps the model's outputs alive through backward instead (the JSON's ``keep_outputs`` says which). Prints
one row per strategy (activation memory, predicted peak, whether it fits, FLOPs ratio) and, with
``--device-memory``, the cheapest per-block plan whose whole step fits (``--plan-json`` saves it for
``hf_ckpt.enable(model, plan=...)``). For a causal LM the row ``full+head:<tokens>`` is every block checkpointed
with the output projection and loss in checkpointed chunks (``head_chunk_size``); a plan chunks the head only
when nothing fits without; ``--mlp-chunk-size`` adds the rows with every block's MLP in chunks too. ``--max-seq``
(with ``--device-memory``, no ``--seq``) prints the longest sequence that fits instead (:mod:`hf_ckpt.estimation._max_seq`).
``--check`` instead runs a real CPU step of a tiny model of the same
architecture and compares it with the estimate. Exit status: 0, 1 when nothing fits (or the check fails), 2 for
bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from typing import Any, Callable

from hf_ckpt import estimation
from hf_ckpt.runtime.util.units import format_bytes, parse_size
from hf_ckpt.cli.errors import CommandError

NAME = "estimate"
HELP = "will it fit? predicted training memory and recompute cost per checkpointing strategy, from a config"


def _add_adapter_arguments(parser: argparse.ArgumentParser) -> None:
    """LoRA as peft configures it, a quantized base (QLoRA), and the micro-batches an optimizer step takes."""
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1, metavar="N",
                        help="micro-batches per optimizer step (default 1: each step's gradients appear during its "
                             "backward as the activations are freed; above 1 the later micro-batches hold them all)")
    parser.add_argument("--lora-r", type=int, default=None, metavar="R",
                        help="train LoRA adapters of rank R (peft; float32 adapters, as peft keeps them), the base "
                             "frozen")
    parser.add_argument("--lora-targets", default=None, metavar="NAMES",
                        help="with --lora-r: comma-separated module names to adapt (peft's target_modules; default "
                             "all-linear)")
    parser.add_argument("--lora-alpha", type=float, default=None, metavar="ALPHA",
                        help="with --lora-r: lora_alpha (default 2R; it scales, it does not change memory)")
    parser.add_argument("--lora-dropout", type=float, default=None, metavar="P",
                        help="with --lora-r: lora_dropout (default 0); above 0 each adapted module keeps its dropped "
                             "input and the dropout mask for backward")
    parser.add_argument("--lora-modules-to-save", default=None, metavar="NAMES",
                        help="with --lora-r: comma-separated modules trained whole beside the adapters (peft's "
                             "modules_to_save, e.g. lm_head)")
    parser.add_argument("--quantize", default=None, metavar="BITS",
                        help="the base loaded by bitsandbytes in 4bit or 8bit (transformers' BitsAndBytesConfig); "
                             "with --lora-r: QLoRA")
    parser.add_argument("--quant-type", default=None, metavar="TYPE", help="with --quantize 4bit: nf4 (default) or fp4")
    parser.add_argument("--double-quant", action="store_true",
                        help="with --quantize 4bit: double quantization (bnb_4bit_use_double_quant)")
    parser.add_argument("--quant-compute-dtype", default=None, metavar="DTYPE",
                        help="with --quantize 4bit: bnb_4bit_compute_dtype (default: --autocast, else --dtype; only "
                             "that dtype is modelled)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``hf-ckpt estimate``'s options."""
    parser.add_argument("config", metavar="CONFIG", help="a config.json, or a folder holding one")
    parser.add_argument("--batch", type=int, required=True, help="sequences per step (per device)")
    parser.add_argument("--seq", type=int, default=None,
                        help="tokens per sequence (required, but with --max-seq, which searches for it)")
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16 (default), float16 or float32")
    parser.add_argument("--autocast", default=None, metavar="DTYPE",
                        help="mixed precision: forward under autocast to bfloat16 or float16, over --dtype weights "
                             "(the Trainer's bf16=True with float32 weights: --dtype float32 --autocast bf16)")
    parser.add_argument("--device", default="cuda", help="cuda (default; attention kernels modelled) or cpu")
    parser.add_argument("--optimizer", default="adamw",
                        help="the Trainer's optim name (adamw_torch, adamw_torch_fused, adamw_8bit, paged_adamw_8bit, "
                             "adafactor, lion_8bit, sgd, ...), or adamw (default), adam, sgd_momentum")
    _add_adapter_arguments(parser)
    parser.add_argument("--attn", default=None, metavar="KIND",
                        help="the model's attention: eager (traced as written: keeps the attention probabilities), "
                             "sdpa (the default) or flash (flash_attention_2, CUDA only)")
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
    parser.add_argument("--fsdp-param-dtype", default=None, metavar="DTYPE",
                        help="FSDP2's mixed precision, MixedPrecisionPolicy(param_dtype=DTYPE): bfloat16 or float16 "
                             "units gathered and computed over --dtype shards and states (with --shard fsdp-*)")
    parser.add_argument("--head-chunk-size", type=int, default=None, metavar="TOKENS",
                        help="tokens per chunk of the chunked head (the row full+head:TOKENS; default: chosen from "
                             "the vocabulary and hidden sizes, at least 128 tokens or the sequence length)")
    parser.add_argument("--mlp-chunk-size", type=int, default=None, metavar="TOKENS",
                        help="tokens per chunk of the chunked MLP (the rows full+mlp:TOKENS and "
                             "full+head:<c>+mlp:TOKENS; default: not estimated, 4096 with --max-seq)")
    parser.add_argument("--offload", action="store_true",
                        help="also the rows <row>+offload of every row with every block full: hf_ckpt.enable(..., "
                             "offload=True), the checkpointed block inputs in host memory (the table's host column) "
                             "but two in flight on the device")
    parser.add_argument("--max-seq", action="store_true",
                        help="with --device-memory: the longest --seq at --batch for which some plan fits (full; + head "
                             "chunks; + MLP chunks; + checkpointed inputs offloaded, with --host-memory), the plan, and "
                             "what binds at the next step up")
    parser.add_argument("--host-memory", default=None, metavar="SIZE",
                        help="with --max-seq: host memory for offloaded checkpointed inputs (256GiB); without it, no plan "
                             "offloads")
    parser.add_argument("--pcie-bandwidth", type=float, default=25.0, metavar="GB/S",
                        help="with --max-seq or --offload: host<->device copy bandwidth in GB/s, against which "
                             "offload copies are compared with a block's compute (default 25: PCIe 4.0 x16 effective)")
    parser.add_argument("--device-memory", default=None, metavar="SIZE",
                        help="memory of one device (80GiB): marks what fits and prints the cheapest plan that fits")
    parser.add_argument("--json", metavar="PATH", help="write the estimate (and the plan) as JSON to PATH")
    parser.add_argument("--plan-json", metavar="PATH", help="with --device-memory: write the plan to PATH")
    parser.add_argument("--check", action="store_true",
                        help="compare the estimate with a real CPU step of a tiny model of this architecture")


def run(args: argparse.Namespace) -> int:
    """Run ``hf-ckpt estimate``; returns the exit status."""
    device_memory = _device_memory(args)
    quantization = _quantization(args)
    _refuse_combinations(args, quantization)
    if args.check:
        return estimation._check.run_check(args.config)
    if args.max_seq:  # the longest sequence that fits, printed (and written as JSON); 1 when nothing fits
        _check_max_seq(args, device_memory)
        found = _computed(estimation._max_seq.max_seq, args, quantization, device_memory=device_memory,
                          host_memory=args.host_memory, pcie_bandwidth=args.pcie_bandwidth * 1e9)
        print(found)
        if args.json is not None:
            _write_json(args.json, asdict(found), "result")
        return 0 if found.seq_len else 1
    if args.seq is None:
        raise CommandError("--seq is required (tokens per sequence), but with --max-seq")
    if args.host_memory is not None:
        raise CommandError("--host-memory only applies with --max-seq; drop it or add --max-seq")
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    made = _computed(estimation._estimate.estimate, args, quantization, seq_len=args.seq, strategies=strategies,
                     offload_activations=args.offload, gradient_accumulation_steps=args.gradient_accumulation_steps)
    print(str(made).rsplit("\n", 1 + len(made.activation_bytes) + 1)[0])
    print(made.table(device_memory))
    data = made.to_dict()
    status = 0
    if device_memory is not None:
        print(f"device memory {format_bytes(device_memory)}: "
              f"{', '.join(n for n, ok in made.fits(device_memory).items() if ok) or 'no strategy'} fits")
        data["device_memory_bytes"] = device_memory
        data["fits"] = made.fits(device_memory)
        try:
            plan = estimation._plan.plan_from_estimate(made, device_memory, whole_step=True)
        except ValueError as error:
            print(str(error))
            data["plan"] = None
            status = 1
        else:
            print(estimation._plan.plan_line(plan, made))
            data["plan"] = plan.to_dict()
            if args.plan_json is not None:
                plan.save(args.plan_json)
                print(f"plan written to {args.plan_json}")
    if made.activation_host_bytes and made.device == "cuda":
        bandwidth, copies = args.pcie_bandwidth * 1e9, estimation._max_seq
        print(copies.copies_line(*copies.copy_and_compute_seconds(made, bandwidth), bandwidth, copies.DEVICE_FLOPS))
    if made.attention.get("modelled"):
        print(f"note: {made.attention['note']}")
    if args.json is not None:
        _write_json(args.json, data, "estimate")
    return status


def _computed(function: Callable[..., Any], args: argparse.Namespace, quantization: Any, **options: Any) -> Any:
    """``function`` (the estimator's ``estimate`` or ``max_seq``) on ``args.config`` with the options both take and
    ``options``; its argument errors as the command's, naming the option."""
    try:
        return function(args.config, batch_size=args.batch, dtype=args.dtype, autocast=args.autocast,
                        device=args.device, optimizer=args.optimizer, peft_config=_lora(args),
                        keep_outputs=args.keep_outputs, world_size=args.world_size, shard=args.shard,
                        offload_optimizer=args.offload_optimizer, offload_parameters=args.offload_parameters,
                        fsdp_param_dtype=args.fsdp_param_dtype, head_chunk_size=args.head_chunk_size,
                        mlp_chunk_size=args.mlp_chunk_size, quantization_config=quantization,
                        attn_implementation=args.attn, **options)
    except (ValueError, FileNotFoundError) as error:
        raise CommandError(_option_names(str(error))) from None


def _check_max_seq(args: argparse.Namespace, device_memory: int | None) -> None:
    """``--max-seq``: it needs ``--device-memory`` and searches for ``--seq`` itself."""
    if device_memory is None:
        raise CommandError("--max-seq needs --device-memory (the memory the step must fit)")
    if args.seq is not None:
        raise CommandError("--max-seq searches for the sequence length itself; drop --seq")
    if args.check or args.plan_json is not None:
        raise CommandError("--max-seq cannot be combined with --check or --plan-json; drop them")


def _write_json(path: str, data: Any, what: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
    print(f"{what} written to {path}")


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
        compute = estimation._arguments.check_dtype(args.quant_compute_dtype or args.autocast or args.dtype)
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
