"""What a cut across the blocks would reach: the points where a correct torch.compile recomputes less at equal memory.

hf_ckpt partitions one block at a time. At three points of ``benchmarks/oplevel_budget.py`` (GPT-2 at 25%, BERT at
25% and 50%) torch.compile's partitioner, which sees the whole model as one graph, recomputes less at equal memory.
This prototype (not a hf_ckpt strategy) measures what the same partitioner reaches in eager mode when it too sees
the whole model:

1. dynamo captures the model's forward; AOT autograd traces the joint graph (dropout as a mask drawn from a shape,
   as hf_ckpt's partitioned blocks do) and splits it with ``min_cut_rematerialization_partition`` under
   ``activation_memory_budget = F``, random ops replayed (:mod:`hf_ckpt.strategies.partition.graph`);
2. both graphs run op by op with the model's own kernels (no inductor);
3. random ops replay either the CPU generator's state saved in forward (``--rng state``: the eager model's masks
   exactly, 5,056 bytes a random op) or an 8-byte seed drawn in forward (``--rng seed``: masks drawn from the seed,
   as inductor draws them; not the masks of a model without checkpointing).

For each point it measures ``compile_seeded:F`` (a correct compile: pytorch/pytorch#190758) and bisects the
whole-graph budget for the largest one whose bytes fit compile's; bytes are counted by the same saved-tensor hooks
and FLOPs from the same graphs (:class:`hf_ckpt.measure._compiled.CompiledReference`).

    PYTHONPATH=. python benchmarks/whole_graph.py --rng seed
"""

from __future__ import annotations

import argparse
import functools
import inspect
import sys

import torch

from hf_ckpt.meters.step import training_step
from hf_ckpt.measure.workload import build_workload
from hf_ckpt.measure._compiled import CompiledReference
from hf_ckpt.strategies.partition.graph import _DROPOUT_AS_MASK, _eager, _partition_replaying_random_ops

SIZES = {"llama": dict(layers=8, hidden=256), "gpt2": dict(layers=4, hidden=256), "bert": dict(layers=4, hidden=256)}


def _save_seed(op, *args, **kwargs):
    seed = torch.randint(0, 2**62, (), dtype=torch.int64)  # drawn from the global generator: the stream moves on
    return seed, _with_seed(seed, op, *args, **kwargs)


def _with_seed(seed, op, *args, **kwargs):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return op(*args, **kwargs)


class WholeGraph(CompiledReference):
    """The whole model's graph partitioned at ``budget`` and run eagerly; measured as ``compile:F`` is."""

    def __init__(self, budget: float, rng: str) -> None:
        super().__init__(budget)
        self.rng = rng

    @property
    def name(self) -> str:
        return f"whole-graph({self.rng}):{self.budget:g}"

    def _compiler(self, graph_module, example_inputs, is_backward: bool):
        from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

        self._record(graph_module, is_backward)
        if self.rng == "seed":
            for node in graph_module.graph.nodes:
                node.target = {run_and_save_rng_state: _save_seed, run_with_rng_state: _with_seed}.get(node.target,
                                                                                                      node.target)
        return _eager(graph_module)

    def _backend(self, graph, example_inputs):
        import torch._functorch.config as functorch_config
        from functorch.compile import min_cut_rematerialization_partition
        from torch._dynamo.backends.common import aot_autograd

        def partition(joint, joint_inputs, **kwargs):
            return _partition_replaying_random_ops(min_cut_rematerialization_partition, joint, joint_inputs, **kwargs)

        backend = aot_autograd(fw_compiler=functools.partial(self._compiler, is_backward=False),
                               bw_compiler=functools.partial(self._compiler, is_backward=True),
                               partition_fn=partition, decompositions=_DROPOUT_AS_MASK)
        with functorch_config.patch(activation_memory_budget=self.budget):
            return backend(graph, example_inputs)


def _measure(reference, model, batch, loss_fn) -> tuple[int, int]:
    reference.prepare(model, batch, lambda: training_step(model, batch, loss_fn))
    return reference.measure(model, batch, loss_fn)


def _point(name: str, budget: float, rng: str, steps: int) -> str:
    work = build_workload(name, **SIZES[name])
    model, batch, loss_fn = work.model, dict(work.batch), work.loss_fn
    if "use_cache" in inspect.signature(model.forward).parameters:
        batch["use_cache"] = False
    _, compile_none = _measure(CompiledReference(1.0), model, batch, loss_fn)
    target, compiled = _measure(CompiledReference(budget, keep_random=True), model, batch, loss_fn)
    _, graph_none = _measure(WholeGraph(1.0, rng), model, batch, loss_fn)
    low, high, best = max(budget - 0.1, 0.0), min(budget + 0.1, 1.0), None
    for _ in range(steps):  # the largest whole-graph budget whose bytes fit compile_seeded's
        middle = (low + high) / 2
        saved, flops = _measure(WholeGraph(middle, rng), model, batch, loss_fn)
        print(f"  {name} whole-graph({rng}):{middle:.4f}: {saved} bytes, recompute {(flops - graph_none) / 1e9:.3f} "
              "GFLOP", flush=True)
        if saved <= target:
            low, best = middle, (middle, saved, flops - graph_none)
        else:
            high = middle
    line = f"{name} {budget:.0%}: compile_seeded:{budget:g} {target} bytes, recompute {(compiled - compile_none) / 1e9:.3f} GFLOP"
    if best is None:
        return line + f" | whole-graph({rng}): nothing fits in {steps} steps"
    return line + (f" | whole-graph({rng}):{best[0]:.4f} {best[1]} bytes ({best[1] - target:+d}), recompute "
                   f"{best[2] / 1e9:.3f} GFLOP")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", nargs="+", default=["gpt2:0.25", "bert:0.25", "bert:0.5"],
                        help="MODEL:F, F the compile budget")
    parser.add_argument("--rng", choices=["state", "seed"], default="seed")
    parser.add_argument("--steps", type=int, default=7, help="bisection steps per point")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    lines = []
    for point in args.points:
        name, _, budget = point.partition(":")
        lines.append(_point(name, float(budget), args.rng, args.steps))
        print(lines[-1], flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
