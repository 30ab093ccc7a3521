"""The config fixtures are the public config.json files: the estimator counts the published parameter totals.

The totals are the ones the Hub shows for each checkpoint (safetensors metadata); a fixture value written wrong,
or a parameter counted twice (tied embeddings) or missed, changes them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hf_ckpt.estimation._model import build_on_meta, load_config, model_class
from hf_ckpt.estimation._states import count_states

pytestmark = pytest.mark.edge_releases  # the matrix's ends only (tests/release_guard.py)

CONFIGS = Path(__file__).parent / "data" / "configs"
PUBLISHED_PARAMETERS = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "mistral-7b-v0.1": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512,
    "gemma-2-9b": 9_241_705_984,
    "mixtral-8x7b-v0.1": 46_702_792_704,
    "t5-base": 222_903_552,
    "bert-base-uncased": 109_514_298,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_fixture_has_the_published_parameter_count(name):
    config = load_config(CONFIGS / f"{name}.json")
    model = build_on_meta(model_class(config), config, torch.bfloat16)
    states = count_states(model, "adamw", "cuda")
    assert states.parameters == PUBLISHED_PARAMETERS[name]
    assert states.parameters_bytes == 2 * PUBLISHED_PARAMETERS[name]  # bf16
    assert states.optimizer_bytes == 2 * states.gradients_bytes  # AdamW on CUDA: two states, step on the host
