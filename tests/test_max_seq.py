"""``max_seq`` and ``hf-ckpt estimate --max-seq``: the longest sequence for which some plan fits.

What users rely on: the length printed fits (the estimate at that length is within the budgets) and the next step up
does not, for the plan named; plans that chunk the MLP and offload reach further than plain checkpointing; what binds
is named (device memory, host memory, attention's own memory); bad input is refused at the call, naming the option.
"""

from __future__ import annotations

import pytest
import transformers

from hf_ckpt import cli
from hf_ckpt.estimation import estimate, max_seq
from hf_ckpt.estimation._max_seq import PlanFit, _binds, _longest, _quadratic

pytestmark = pytest.mark.edge_releases  # the matrix's ends only (tests/release_guard.py)


@pytest.mark.any_release
def test_the_fit_is_exact_through_three_points_and_the_search_finds_the_last_length_that_fits():
    a, b, c = _quadratic([(1, 10.0), (2, 14.0), (4, 25.0)])  # 7 + 2.5 s + 0.5 s^2
    assert (a, b, c) == pytest.approx((7.0, 2.5, 0.5))
    fit = PlanFit("full", (100.0, 10.0, 0.0), (0.0, 4.0, 0.0))
    assert _longest(fit, 100 + 10 * 1000, None, 64) == 960  # 1000 tokens fit; multiples of 64: 960
    assert _longest(fit, 100 + 10 * 1000, 4 * 512, 64) == 512  # the host binds first
    assert _binds(fit, 512, 64, 4 * 512) == "host memory"
    assert _binds(fit, 960, 64, None) == "device memory"
    assert _binds(PlanFit("full", (0.0, 1.0, 1.0)), 960, 64, None) == "attention's own memory"
    # a fused kernel keeps no scores: a quadratic term in the fit is no attention's
    assert _binds(PlanFit("full", (0.0, 1.0, 1.0)), 960, 64, None, scores_kept=False) == "device memory"


@pytest.mark.parametrize(("argv", "message"), [
    (["--max-seq"], "--max-seq needs --device-memory"),
    (["--max-seq", "--device-memory", "1GiB", "--seq", "8"], "--max-seq searches for the sequence length itself"),
    (["--device-memory", "1GiB"], "--seq is required"),
    (["--seq", "8", "--host-memory", "1GiB"], "--host-memory only applies with --max-seq"),
    (["--max-seq", "--device-memory", "1GiB", "--offload"],
     "--offload: --max-seq offloads the checkpointed inputs where --host-memory is given; drop --offload"),
    (["--seq", "8", "--check", "--offload"], "--offload: --check compares a step without offload"),
])
def test_argument_errors(tmp_path, argv, message, capsys):
    transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=64).save_pretrained(tmp_path)
    code = cli.main(["estimate", str(tmp_path / "config.json"), "--batch", "1", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err


@pytest.mark.parametrize(("options", "message"), [
    ({"device_memory": "lots"}, "device_memory:"),
    ({"device_memory": "1GiB", "host_memory": -1}, "host_memory must be bytes"),
    ({"device_memory": "1GiB", "mlp_chunk_size": 0}, "mlp_chunk_size"),
    ({"device_memory": "1GiB", "pcie_bandwidth": 0}, "pcie_bandwidth must be a positive number"),
    ({"device_memory": "1GiB", "seq_len": 8}, "max_seq chooses seq_len itself"),
    ({"device_memory": "1GiB", "offload_activations": True}, "max_seq chooses offload_activations itself"),
])
def test_bad_arguments_are_refused_at_the_call(options, message):
    with pytest.raises(ValueError) as raised:
        max_seq(transformers.LlamaConfig(), **options)
    assert message in str(raised.value)


_CHUNK, _STEP = 256, 256


def _config():
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=256, max_position_embeddings=1 << 20)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_the_length_found_fits_and_the_next_step_up_does_not():
    options = dict(dtype="float32", device="cpu")
    found = max_seq(_config(), device_memory="48MiB", host_memory="8MiB", head_chunk_size=_CHUNK,
                    mlp_chunk_size=_CHUNK, granularity=_STEP, **options)
    assert found.seq_len > 0 and found.plan is not None
    assert found.lengths["full"] < found.lengths[f"full+head:{_CHUNK}+mlp:{_CHUNK}"] <= found.seq_len
    row = found.plan.removesuffix("+offload")
    for seq_len, fits in ((found.seq_len, True), (found.seq_len + _STEP, False)):
        made = estimate(_config(), batch_size=1, seq_len=seq_len, strategies=("full",), head_chunk_size=_CHUNK,
                        mlp_chunk_size=_CHUNK, **options)
        device = made.peak_bytes[row]
        host = 0
        if found.plan.endswith("+offload"):
            inputs = made.block_bytes["full"]
            device -= sum(inputs) - 2 * max(inputs)
            host = sum(inputs)
        assert (device <= 48 * 2**20 and host <= 8 * 2**20) is fits, (seq_len, device, host)
    # on the CPU the math path keeps each block's attention scores: at this length they grow faster than the rest
    assert found.binds == "attention's own memory"
    assert f"{found.seq_len:,} tokens with {found.plan}" in str(found)
