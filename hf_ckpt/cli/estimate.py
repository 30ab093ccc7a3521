"""``hf-ckpt estimate``: will it fit? Training memory per checkpointing strategy, from a ``config.json``.

    hf-ckpt estimate path/to/config.json --batch 1 --seq 8192 --device-memory 80GiB --lora-r 16 --json est.json
    hf-ckpt estimate path/to/config.json --batch 1 --seq 8192 --world-size 8 --shard zero3 --device-memory 80GiB

The step estimated is the ``Trainer``'s (only the loss is held into backward); ``--keep-outputs`` estimates a loop
that keeps the model's outputs alive through backward instead (the JSON's ``keep_outputs`` says which). Prints
one row per strategy (activation memory, predicted peak, whether it fits, FLOPs ratio) and, with
``--device-memory``, the cheapest per-block plan whose whole step fits (``--plan-json`` saves it for
``hf_ckpt.enable(model, plan=...)``). For a causal LM the row ``full+head:<tokens>`` is every block checkpointed
with the output projection and loss in checkpointed chunks (``head_chunk_size``); a plan chunks the head only
when nothing fits without. ``--check`` instead runs a real CPU step of a tiny model of the same
architecture and compares it with the estimate. Exit status: 0, 1 when nothing fits (or the check fails), 2 for
bad arguments. The parser; the run is :mod:`hf_ckpt.cli._estimate_run`.
"""

from __future__ import annotations

import argparse

from hf_ckpt.cli._lazy import runner

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
    parser.add_argument("--head-chunk-size", type=int, default=None, metavar="TOKENS",
                        help="tokens per chunk of the chunked head (the row full+head:TOKENS; default: chosen from "
                             "the vocabulary and hidden sizes, at least 128 tokens or the sequence length)")
    parser.add_argument("--device-memory", default=None, metavar="SIZE",
                        help="memory of one device (80GiB): marks what fits and prints the cheapest plan that fits")
    parser.add_argument("--json", metavar="PATH", help="write the estimate (and the plan) as JSON to PATH")
    parser.add_argument("--plan-json", metavar="PATH", help="with --device-memory: write the plan to PATH")
    parser.add_argument("--check", action="store_true",
                        help="compare the estimate with a real CPU step of a tiny model of this architecture")


run = runner("hf_ckpt.cli._estimate_run:run")
