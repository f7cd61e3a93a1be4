"""``python -m mtp_bindings.scale_pair``: the ``scale-pair`` command on its own."""

from .build import main

raise SystemExit(main())
