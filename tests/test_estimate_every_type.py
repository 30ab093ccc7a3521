"""The estimate over every model type the architecture sweep builds: it runs, or refuses in one line naming why.

The entries are ``test_every_model_type``'s (``tests/test_architectures.py``): by default its stratified sample
(``SAMPLE``), with ``HF_CKPT_SWEEP=full`` every model type of the release that supports checkpointing. Each is
estimated from the tiny config the sweep builds its class from (``arch_build.model_config``), with that class named
in ``config.architectures`` (the class the estimate then builds). It must return a :class:`MemoryEstimate` whose
peak and activation figures are positive, or raise a ValueError of one line that starts with ``model_or_config:``
(vision and audio models, base models with no training head, ...): never another exception.
"""

from __future__ import annotations

import pytest

import arch_build  # tests/ is on sys.path (conftest.py)
from hf_ckpt.estimation import MemoryEstimate, estimate
from test_architectures import GENERIC

pytestmark = pytest.mark.edge_releases  # the matrix's ends only (tests/release_guard.py)


#: The sample's text models (test_architectures.SAMPLE): with their task head, each is estimated, never refused.
ESTIMATED_WITH_THEIR_HEAD = ("llama", "bert", "t5")


@pytest.mark.parametrize("head", ["swept class", "task head"])
@pytest.mark.parametrize("entry", GENERIC, ids=lambda entry: entry.model_type)
def test_every_model_type_is_estimated_or_refused_in_one_line(entry: arch_build.ModelType, head: str) -> None:
    """The sweep's class (mostly base models: refused, no training head), and the config alone, for which the
    estimate picks the task head (causal LM, seq2seq, masked LM, image-text-to-text)."""
    config = arch_build.model_config(entry)
    config.architectures = [entry.class_name] if head == "swept class" else None
    try:
        made = estimate(config, batch_size=2, seq_len=8, strategies=("none", "full"))
    except ValueError as error:
        message = str(error)
        assert message.startswith("model_or_config: ") and "\n" not in message, message
        assert not (head == "task head" and entry.model_type in ESTIMATED_WITH_THEIR_HEAD), message
        return
    assert isinstance(made, MemoryEstimate) and (head == "task head" or made.model_class == entry.class_name)
    assert made.peak_bytes and all(value > 0 for value in made.peak_bytes.values()), made.peak_bytes
    assert made.activation_bytes and all(value > 0 for value in made.activation_bytes.values()), made.activation_bytes
