"""One case of the architecture sweep: gradient parity and the exact recomputed blocks, for one model and one way
of enabling checkpointing. Shared by ``test_architectures.py`` (generic sweep) and ``ci/sweep.py``."""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

import hf_ckpt
from hf_ckpt.runtime.blocks import find_blocks
from hf_ckpt.runtime.counting import BlockRunCounter

TOLERANCE = 1e-5
ENTRY_POINTS = ("enable", "patched")
EVERY_N_LAYERS = (1, 2)
MINIMUM_BLOCKS = 2


class Reference:
    """Weights, batch and gradients of a model trained one step without checkpointing."""

    def __init__(self, build: Callable[[], torch.nn.Module], batch: Callable[[torch.nn.Module], dict],
                 gradients: Callable[[torch.nn.Module, dict], dict],
                 live: Callable[[torch.nn.Module, dict], list[int]] | None = None) -> None:
        self.build, self.gradients = build, gradients
        model = build()
        self.batch = batch(model)
        with BlockRunCounter(model) as runs:
            self.grads = gradients(model, self.batch)
        assert runs.recomputed_in_backward() == [], "blocks ran in backward without checkpointing"
        assert self.grads, "no parameter got a gradient"
        assert all(torch.isfinite(g).all() for g in self.grads.values()), "non-finite gradients without checkpointing"
        self.state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        self.blocks = len(find_blocks(model))
        # a block whose weights are tied to a block that ran gets their gradients without running (PE-Audio-Video's
        # per-modality copies of its text model): only blocks that ran can be recomputed
        ran = {index for index, count in runs.counts.items() if count}
        self.live = [i for i in (live(model, self.grads) if live else range(self.blocks)) if i in ran]

    def fresh(self) -> torch.nn.Module:
        model = self.build()
        model.load_state_dict(self.state)
        return model


def enable(model: torch.nn.Module, entry: str, every_n: int) -> None:
    """Turn checkpointing on through ``hf_ckpt.enable`` or through the patched upstream method."""
    if entry == "enable":
        hf_ckpt.enable(model, every_n_layers=every_n)
        return
    hf_ckpt.patch_transformers()
    try:
        # The current name where the release has it (>= 5.23 renamed the method and deprecated the old one).
        method = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            method({"every_n_layers": every_n, "use_reentrant": False})  # as the Trainer passes them
    finally:
        hf_ckpt.unpatch_transformers()


def check(reference: Reference, entry: str, every_n: int) -> dict[str, Any]:
    """Enable, train one step, and assert parity and the exact recomputed blocks; returns what was measured."""
    assert reference.blocks >= MINIMUM_BLOCKS, f"only {reference.blocks} block(s) found"
    model = reference.fresh()
    enable(model, entry, every_n)
    expected = list(range(0, reference.blocks, every_n))
    assert hf_ckpt.checkpointed_layers(model) == expected, f"checkpointed_layers {hf_ckpt.checkpointed_layers(model)}"
    # A block whose output no gradient flows through is never recomputed (non-reentrant checkpointing recomputes
    # on demand), so the measured set is the selection restricted to the blocks the reference trained. hf_ckpt's
    # own first-step probe measures the same: it must warn exactly when that differs from the selection.
    measured = [i for i in expected if i in reference.live]
    with warnings.catch_warnings(record=True) as caught, BlockRunCounter(model) as runs:
        warnings.simplefilter("always", hf_ckpt.HfCkptWarning)
        grads = reference.gradients(model, reference.batch)
    probe = [str(w.message) for w in caught if "Measured in the first training step" in str(w.message)]
    assert len(probe) == (measured != expected), f"probe warnings {probe}"
    others = [str(w.message) for w in caught if issubclass(w.category, hf_ckpt.HfCkptWarning) and str(w.message) not in probe]
    assert others == [], f"unexpected hf_ckpt warnings {others}"
    # A recompute is a run during backward: counting runs per step would also count a block whose first submodule
    # runs twice per forward (Gemma 3n's AltUp router norm) or a looped stack.
    recomputed = runs.recomputed_in_backward()
    assert recomputed == measured, f"measured recompute {recomputed}, expected {measured}"
    assert hf_ckpt.checkpointed_layers(model) == measured, "checkpointed_layers must report what the probe measured"
    assert sorted(grads) == sorted(reference.grads), "a different set of parameters got gradients"
    worst = max(((grads[n] - reference.grads[n]).abs().max().item() for n in reference.grads
                 if reference.grads[n].numel()), default=0.0)
    assert worst <= TOLERANCE, f"max abs gradient difference {worst:.3g}"
    return {"blocks": reference.blocks, "recomputed": expected, "max_diff": worst}
