"""``python -m mtp_bindings.cli``: the command line, as the ``mtp-bindings`` script runs it."""

import sys

from . import main

sys.exit(main())
