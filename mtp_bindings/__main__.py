"""``python -m mtp_bindings``: the same as the ``mtp-bindings`` command."""

import sys

from .cli import main

sys.exit(main())
