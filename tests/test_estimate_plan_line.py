"""One figure per setting: the command's "cheapest plan that fits" line gives the table's figures where the plan is
a setting the table has (every block on one strategy), and says what differs where it is not."""

from __future__ import annotations

import pytest
import transformers

from hf_ckpt import cli
from hf_ckpt.estimation import estimate
from hf_ckpt.runtime.util.units import format_bytes, format_flops

pytestmark = pytest.mark.edge_releases  # the matrix's ends only (tests/release_guard.py)


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    folder = tmp_path_factory.mktemp("config")
    transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                             num_hidden_layers=6, vocab_size=256, max_position_embeddings=256).save_pretrained(folder)
    made = estimate(str(folder), batch_size=2, seq_len=128, strategies=("none", "full", "selective"))
    return str(folder), made


def _line(folder, memory, capsys):
    assert cli.main(["estimate", folder, "--batch", "2", "--seq", "128", "--strategies", "none,full,selective",
                     "--device-memory", f"{memory}B"]) == 0
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("cheapest plan that fits:"))


def test_a_plan_the_table_has_gets_the_tables_figures(setting, capsys):
    folder, made = setting
    line = _line(folder, 2 * made.peak_bytes["none"], capsys)  # everything fits: no block checkpointed
    assert line == (f"cheapest plan that fits: 0 full, 0 selective, 6 none; activations "
                    f"{format_bytes(made.activation_bytes['none'])}, peak {format_bytes(made.peak_bytes['none'])}, "
                    f"recompute {format_flops(0)}, FLOPs ratio 1.000x (the table's row none)")


def test_a_mixed_plan_says_its_activations_are_each_blocks_most(setting, capsys):
    folder, made = setting
    line = _line(folder, (made.peak_bytes["none"] + made.peak_bytes["selective"]) // 2, capsys)
    assert " none;" in line and not line.endswith("(the table's row none)")
    assert line.endswith(" (activations: each block at its most, whatever its neighbours run)")
