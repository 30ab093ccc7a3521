"""The estimate against a real CUDA step: ``torch.cuda`` allocator figures for a ~1B Llama, several strategies.

On a machine with CUDA this builds a TinyLlama-1.1B-shaped model from its config (random weights, bf16), and for
each strategy runs real training steps (forward, backward, AdamW step) and compares:

* activation memory: ``memory_allocated`` after forward less before, vs ``estimate(...).activation_bytes``;
* step peak: ``max_memory_allocated`` over a step, vs ``estimate(...).peak_bytes``.

The CUDA attention figures of the estimate are modelled (flash / memory-efficient kernels keep output and
log-sum-exp); this script is what verifies them. Without CUDA it says so and exits 0.

``--overlap`` checks the longest-sequence plan's parts instead (#47): every block full with the MLP in chunks
(``mlp_chunk_size``), without and with the checkpointed inputs offloaded (``offload=True``): the activations on the
device against the estimate (the offloaded plan's: ``full+mlp:<m>`` less the inputs moved to the host, two kept in
flight), and the step time with offload against without (the copies hide behind compute when they are about equal).

    PYTHONPATH=. python benchmarks/gpu_check.py [--batch 2 --seq 2048] [--overlap [--mlp-chunk 1024]]
"""

from __future__ import annotations

import argparse
import sys
import warnings


def _config():
    import transformers

    return transformers.LlamaConfig(  # TinyLlama-1.1B's shape
        hidden_size=2048, intermediate_size=5632, num_attention_heads=32, num_key_value_heads=4,
        num_hidden_layers=22, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--strategies", default="none,full,every_n:2,selective")
    parser.add_argument("--overlap", action="store_true", help="the chunked MLP and offloaded checkpoints (#47)")
    parser.add_argument("--mlp-chunk", type=int, default=1024)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: needs a CUDA device (torch.cuda.is_available() is False here); nothing to compare")
        return 0
    warnings.simplefilter("ignore")
    import transformers

    import hf_ckpt
    from hf_ckpt.estimation import estimate

    if args.overlap:
        return _overlap(args)
    strategies = [s for s in args.strategies.split(",") if s]
    config = _config()
    predicted = estimate(config, batch_size=args.batch, seq_len=args.seq, dtype="bfloat16", device="cuda",
                         optimizer="adamw", strategies=strategies)
    print(predicted)
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(3, config.vocab_size, (args.batch, args.seq), device=device)
    batch = {"input_ids": ids, "labels": ids}
    print(f"\n{torch.cuda.get_device_name(device)}; batch {args.batch} x seq {args.seq}, bf16, AdamW")
    print(f"{'strategy':10s} {'activations GiB':>16s} {'estimate':>9s} {'diff':>7s}   {'peak GiB':>9s} {'estimate':>9s} {'diff':>7s}")
    for strategy in strategies:
        hf_ckpt.disable(model)
        if strategy.startswith("every_n:"):
            hf_ckpt.enable(model, every_n_layers=int(strategy.split(":")[1]))
        elif strategy != "none":
            hf_ckpt.enable(model, strategy=strategy)
        for _warm in range(2):  # the second step runs with optimizer states allocated, as training does
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            loss = model(**batch).loss
            torch.cuda.synchronize()
            activations = torch.cuda.memory_allocated() - before
            loss.backward()
            del loss
            optimizer.step()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        act_pred, peak_pred = predicted.activation_bytes[strategy], predicted.peak_bytes[strategy]
        print(f"{strategy:10s} {activations / 2**30:16.3f} {act_pred / 2**30:9.3f} "
              f"{100 * (act_pred - activations) / activations:+6.1f}%   {peak / 2**30:9.3f} {peak_pred / 2**30:9.3f} "
              f"{100 * (peak_pred - peak) / peak:+6.1f}%")
    hf_ckpt.disable(model)
    return 0


def _overlap(args) -> int:
    """Device activations and step time of full+mlp chunks, without and with offloaded checkpointed inputs."""
    import time

    import torch
    import transformers

    import hf_ckpt
    from hf_ckpt.estimation import estimate

    config, chunk = _config(), args.mlp_chunk
    made = estimate(config, batch_size=args.batch, seq_len=args.seq, dtype="bfloat16", device="cuda",
                    strategies=("full",), mlp_chunk_size=chunk)
    inputs = made.block_bytes["full"]
    row = f"full+mlp:{chunk}"
    predicted = {"mlp": made.activation_bytes[row],
                 "mlp+offload": made.activation_bytes[row] - (sum(inputs) - 2 * max(inputs))}
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).train()
    ids = torch.randint(3, config.vocab_size, (args.batch, args.seq), device="cuda")
    print(f"{'setting':12s} {'activations GiB':>16s} {'estimate':>9s} {'diff':>7s} {'step s':>8s}")
    for name, options in (("mlp", {}), ("mlp+offload", {"offload": True})):
        hf_ckpt.enable(model, mlp_chunk_size=chunk, **options)
        times = []
        for _round in range(3):
            model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            before, start = torch.cuda.memory_allocated(), time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            torch.cuda.synchronize()
            activations = torch.cuda.memory_allocated() - before
            loss.backward()
            del loss
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        hf_ckpt.disable(model)
        print(f"{name:12s} {activations / 2**30:16.3f} {predicted[name] / 2**30:9.3f} "
              f"{100 * (predicted[name] - activations) / activations:+6.1f}% {sorted(times)[1]:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
