"""``python -m hf_ckpt``: the ``hf-ckpt`` command."""

import sys

from hf_ckpt.cli import main

sys.exit(main())
