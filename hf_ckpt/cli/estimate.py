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
(with ``--device-memory``, no ``--seq``) prints the longest sequence that fits instead (:mod:`hf_ckpt.estimate._max_seq`).
``--check`` instead runs a real CPU step of a tiny model of the same
architecture and compares it with the estimate. Exit status: 0, 1 when nothing fits (or the check fails), 2 for
bad arguments. The parser; the run is :mod:`hf_ckpt.cli._estimate_run`.
"""

from __future__ import annotations

import argparse

from hf_ckpt.cli._lazy import runner

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


run = runner("hf_ckpt.cli._estimate_run:run")
