"""``python -m hf_ckpt``: the ``hf-ckpt`` command."""

import sys

from .cli import main

sys.exit(main())
