"""``python -m mtp_bindings.benchmark``: the same as ``mtp-bindings bench``."""

import sys

from .command import main

sys.exit(main())
