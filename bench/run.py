#!/usr/bin/env python3
"""Thin wrapper: ``python bench/run.py [--quick|--full] [...]`` is ``mtp-bindings bench [...]``.

All the measurement code lives in :mod:`mtp_bindings.benchmark` (so an installed package can run
it too); see ``bench/README.md``.
"""

import sys

from mtp_bindings.benchmark import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
