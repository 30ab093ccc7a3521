"""Published GPU measurements of real training steps, beside ``hf_ckpt.estimate`` for the same conditions.

Each entry of :data:`SETTINGS` is a peak-memory figure somebody measured on a GPU and published (the source's URL,
the model, batch, sequence length, precision, optimizer, full / LoRA / QLoRA, checkpointing, sharding, the GPU, and
what was read: ``nvidia-smi``'s used memory, the allocator's peak, ...), the estimate's arguments that match those
conditions, and the row of the estimate (the checkpointing strategy) that matches the run. The script estimates each
distinct set of arguments once (on fake tensors, no GPU) and prints a Markdown table:

    setting | published | estimate | ratio | notes

``ratio`` is estimate / published, both in GiB. Where the published figure is ``nvidia-smi``'s (it includes the CUDA
context and the caching allocator's reserve, which the estimate does not), the notes add the ratio with the CUDA
context the same source measured added to the estimate.

Usage (from the repository root; nothing is downloaded, the configs are in ``tests/data/configs`` and
``benchmarks/published``):

    python benchmarks/published_steps.py

It takes about one to two minutes on one CPU core (``OMP_NUM_THREADS=1``; 73 s measured on a busy machine): each
BERT-large estimate takes about 5 s, each Llama-3.1-8B estimate 10 to 20 s (settings that share arguments share one
estimate). ``--only NAME`` (a substring of a setting's name) runs a subset.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONFIGS = os.path.join(ROOT, "tests", "data", "configs")
PUBLISHED = os.path.join(HERE, "published")

GIB = 1024 ** 3
MIB = 1024 ** 2
GB = 1000 ** 3

# The CUDA context the BERT-large source measured itself (nvidia-smi after torch.ones((1, 1)).to("cuda")): 1343 MB,
# which its helper computes as info.used // 1024**2, i.e. MiB.
BERT_CONTEXT = 1343 * MIB

HF_ANATOMY = ("https://huggingface.co/docs/transformers/model_memory_anatomy "
              "(github.com/huggingface/transformers docs/source/en/model_memory_anatomy.md)")
HF_ONE_GPU = ("https://huggingface.co/docs/transformers/zh/perf_train_gpu_one "
              "(github.com/huggingface/transformers docs/source/zh/perf_train_gpu_one.md; the same runs are in the "
              "ko page and in the English page before it was rewritten)")
TORCHTUNE = "https://github.com/pytorch/torchtune/blob/0031bfb080bd35ec533c412df883cf2bf7bf7fe4/README.md (Memory and training speed)"
TORCHTITAN = "https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md (Table 1)"

BERT = os.path.join(PUBLISHED, "bert-large-uncased.json")
LLAMA8B = os.path.join(CONFIGS, "llama-3.1-8b.json")

BERT_COMMON = ("google-bert/bert-large-uncased, AutoModelForSequenceClassification (2 labels), seq 512 (random ids), "
               "Trainer defaults (AdamW, fp32 weights), eager attention (2022 transformers), V100 16 GB, "
               "read with pynvml (= nvidia-smi used memory) after trainer.train()")


def _lora(r, alpha, targets):
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(targets), task_type="CAUSAL_LM")


def _nf4():
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.bfloat16)


def _bert(name, source, conditions, published, row, assumed="eager attention", **options):
    """One of the BERT-large Trainer runs (V100, nvidia-smi, MiB): ``options`` over the common estimate arguments."""
    kwargs = dict(seq_len=512, dtype="float32", optimizer="adamw_torch", attn_implementation="eager")
    return dict(name=name, kind="full", source=source, conditions=BERT_COMMON + "; " + conditions, gpu="V100 16 GB",
                published=published, unit="MB (MiB)", counter="nvidia-smi", config=BERT,
                kwargs={**kwargs, **options}, row=row, assumed=assumed)


_LORA_TARGETS = ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _torchtune(name, kind, conditions, gpu, published, row, targets, assumed, **options):
    """One of torchtune's Llama-3.1-8B single-device runs (README's table, peak memory in GiB): LoRA r=8, alpha 16 on
    ``targets``, batch 2 x 2048, bf16, fused AdamW, the chunked loss as a chunked head of 256 tokens."""
    kwargs = dict(batch_size=2, seq_len=2048, dtype="bfloat16", optimizer="adamw_torch_fused",
                  peft=("lora", 8, 16, targets), **options, head_chunk_size=256)
    return dict(name=name, kind=kind, source=TORCHTUNE, conditions="torchtune " + conditions, gpu=gpu,
                published=published, unit="GiB", counter="torchtune peak memory", config=LLAMA8B, kwargs=kwargs,
                row=row, assumed=assumed)


# Each setting: what was published (value, unit, counter), where, under which conditions, and the estimate's
# arguments plus the row (strategy) matching the run. "assumed" lists the conditions the source leaves open.
SETTINGS = [
    _bert("BERT-large, full FT, fp32, batch 4", HF_ANATOMY,
          "per_device_train_batch_size=4, no gradient checkpointing", 14949, "none", batch_size=4,
          assumed="eager attention (BERT had no SDPA path in 2022)"),
    _bert("BERT-large, full FT, fp32, batch 1 (grad. accum. 4)", HF_ONE_GPU,
          "per_device_train_batch_size=1, gradient_accumulation_steps=4", 8681, "none", batch_size=1,
          gradient_accumulation_steps=4),
    _bert("BERT-large, full FT, fp32, batch 1, grad. checkpointing", HF_ONE_GPU,
          "batch 1, gradient_accumulation_steps=4, gradient_checkpointing=True", 6775, "full", batch_size=1,
          gradient_accumulation_steps=4),
    _bert("BERT-large, full FT, fp16 mixed precision, batch 4", HF_ONE_GPU,
          "batch 4, fp16=True (autocast over fp32 weights)", 13939, "none", batch_size=4, autocast="float16"),
    _bert("BERT-large, full FT, fp16, batch 1, grad. checkpointing", HF_ONE_GPU,
          "batch 1, gradient_accumulation_steps=4, gradient_checkpointing=True, fp16=True", 7275, "full",
          batch_size=1, autocast="float16", gradient_accumulation_steps=4),
    _bert("BERT-large, full FT, fp32, Adafactor, batch 4", HF_ONE_GPU, 'batch 4, optim="adafactor"', 12295, "none",
          batch_size=4, optimizer="adafactor"),
    _bert("BERT-large, full FT, fp32, 8-bit Adam, batch 4", HF_ONE_GPU,
          "batch 4, bitsandbytes Adam8bit passed to the Trainer", 13085, "none", batch_size=4,
          optimizer="adamw_8bit", assumed="eager attention; adamw_8bit's states stand for bnb.optim.Adam8bit's"),
    _torchtune("Llama-3.1-8B, LoRA, bf16, batch 2 x 2048, act. checkpointing", "LoRA",
               "lora_finetune_single_device, llama3_1/8B_lora_single_device; batch 2, packed to seq 2048, no grad. "
               "accumulation, torch.compile on, bf16 weights, fused AdamW", "1x RTX 4090 (24 GB)", 16.2, "full+head",
               _LORA_TARGETS,
               assumed=("the README gives no per-row config: the 4090 row assumed to be the default config "
                        "(activation checkpointing on, LoRA r=8, alpha 16 on q, v, output_proj and the MLP); "
                        "torchtune's own Llama modules, estimated with transformers' LlamaForCausalLM (SDPA); "
                        "torchtune's chunked CE loss (8 chunks: 256 positions each) read as the row full+head:256, "
                        "which also drops the bf16 logits torchtune keeps; torch.compile not modelled")),
    _torchtune("Llama-3.1-8B, LoRA, bf16, batch 2 x 2048, no act. checkpointing", "LoRA",
               "lora_finetune_single_device; batch 2, packed to seq 2048, torch.compile on, bf16 weights, fused AdamW",
               "1x A6000 (48 GB)", 30.3, "none", _LORA_TARGETS,
               assumed=("the A6000 row assumed to run the same config with activation checkpointing off (the README "
                        "does not say what differs from the 4090 row); without checkpointing the estimate has no "
                        "chunked-head row, so the whole head and float32 loss are counted, and torch.compile's "
                        "fusions (fewer saved intermediates) are not modelled")),
    _torchtune("Llama-3.1-8B, QLoRA (NF4), batch 2 x 2048, act. checkpointing", "QLoRA",
               "lora_finetune_single_device, llama3_1/8B_qlora_single_device (torchao NF4 base); batch 2, packed to "
               "seq 2048, torch.compile on, bf16 compute, fused AdamW", "1x RTX 4090 (24 GB)", 7.4, "full+head",
               ("q_proj", "k_proj", *_LORA_TARGETS[1:]), quantize=True,
               assumed=("config llama3_1/8B_qlora_single_device as stored (r=8, alpha 16, q/k/v/output_proj + MLP, "
                        "activation checkpointing on); torchao's NF4 estimated as bitsandbytes nf4 with double "
                        "quantization (both store 4-bit codes plus quantized block scales); lm_head kept in bf16 in "
                        "both")),
    dict(
        name="Llama-3.1-8B, full FT, FSDP over 8 GPUs, batch 2 x 8192, selective AC",
        kind="full, FSDP",
        source=TORCHTITAN,
        conditions=("torchtitan FSDP2 (1D), 8 GPUs, local batch 2, seq 8192, fp32 sharded parameters with bf16 "
                    "mixed precision, AdamW, selective activation checkpointing, no torch.compile"),
        gpu="8x H100 (96 GB HBM2e)",
        published=82.4, unit="GiB", counter="torchtitan memory",
        config=LLAMA8B, kwargs=dict(batch_size=2, seq_len=8192, dtype="float32", autocast="bfloat16",
                                    optimizer="adamw_torch", world_size=8, shard="fsdp-full"),
        row="selective",
        assumed=("seq 8192 and selective *op* AC are torchtitan's llama3_8b.toml defaults (the table says only "
                 "'selective'); torchtitan's op policy keeps every other matmul output, hf_ckpt's selective all of "
                 "them; FSDP2's bf16 parameter cast estimated as autocast; 'Memory(GiB)' assumed to be the peak "
                 "reserved memory torchtitan logs"),
    ),
]


def _estimate(setting, cache):
    """The estimate for ``setting``'s arguments (each distinct set once), and the seconds it took."""
    kwargs = dict(setting["kwargs"])
    key = json.dumps([setting["config"], kwargs], sort_keys=True, default=str)
    if key in cache:
        return cache[key], 0.0
    from hf_ckpt.estimation import estimate

    peft = kwargs.pop("peft", None)
    quantize = kwargs.pop("quantize", False)
    if peft is not None:
        _, r, alpha, targets = peft
        kwargs["peft_config"] = _lora(r, alpha, targets)
    if quantize:
        kwargs["quantization_config"] = _nf4()
    started = time.perf_counter()
    made = estimate(setting["config"], strategies=("none", "full", "selective"), **kwargs)
    cache[key] = made
    return made, time.perf_counter() - started


def _row(made, row):
    """The estimate's row named ``row``; ``full+head`` is the chunked head's row, whatever its chunk."""
    if row in made.peak_bytes:
        return row
    for name in made.peak_bytes:
        if name.startswith(row + ":"):
            return name
    raise KeyError(f"{row} not among the estimate's rows {sorted(made.peak_bytes)}")


def _published_bytes(setting):
    unit = setting["unit"]
    if unit.startswith("MB (MiB)"):
        return setting["published"] * MIB
    if unit == "GiB":
        return setting["published"] * GIB
    if unit == "GB":
        return setting["published"] * GB
    raise ValueError(unit)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="run only the settings whose name contains this")
    parser.add_argument("--details", action="store_true", help="also print each setting's source and conditions")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cache = {}
    lines = ["| setting | published | estimate | ratio | notes |", "| --- | ---: | ---: | ---: | --- |"]
    started = time.perf_counter()
    for setting in SETTINGS:
        if args.only and args.only not in setting["name"]:
            continue
        made, seconds = _estimate(setting, cache)
        row = _row(made, setting["row"])
        peak = made.peak_bytes[row]
        published = _published_bytes(setting)
        ratio = peak / published
        notes = [f"{setting['kind']}; {setting['gpu']}; {setting['counter']}; row `{row}`"]
        if setting["counter"] == "nvidia-smi":
            with_context = (peak + BERT_CONTEXT) / published
            notes.append(f"+ CUDA context (1343 MiB): {(peak + BERT_CONTEXT) / GIB:.2f} GiB, ratio {with_context:.2f}")
        others = ", ".join(f"`{name}` {made.peak_bytes[name] / GIB:.2f}" for name in made.peak_bytes if name != row)
        notes.append(f"other rows (GiB): {others}")
        shown = f"{setting['published']:g} {setting['unit']} ({published / GIB:.2f} GiB)" \
            if setting["unit"] != "GiB" else f"{setting['published']:g} GiB"
        lines.append(f"| {setting['name']} | {shown} | {peak / GIB:.2f} GiB | {ratio:.2f} | {'; '.join(notes)} |")
        print(f"[{time.perf_counter() - started:6.1f}s] {setting['name']}: estimated in {seconds:.1f}s",
              file=sys.stderr, flush=True)
    print("\n".join(lines))
    if args.details:
        print()
        for setting in SETTINGS:
            if args.only and args.only not in setting["name"]:
                continue
            print(f"- **{setting['name']}**: {setting['source']}. Conditions: {setting['conditions']}. "
                  f"Assumed: {setting['assumed']}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
