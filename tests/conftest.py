import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

#: release_guard: the ``any_release`` mark and its guard; pytester: tests/test_release_guard.py runs the guard on a
#: suite of its own
pytest_plugins = ("pytester", "release_guard")


@pytest.fixture(autouse=True)
def _always_unpatched():
    """No test leaks a patched ``transformers`` into the next one."""
    import hf_ckpt

    yield
    hf_ckpt.unpatch_transformers()


@pytest.fixture
def patched():
    """``transformers`` patched for the test (the autouse fixture above unpatches it after)."""
    import hf_ckpt

    hf_ckpt.patch_transformers()
    yield
    hf_ckpt.unpatch_transformers()
