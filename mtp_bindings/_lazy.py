"""Names a package exports from its modules, imported on first access (PEP 562), so that importing the
package itself stays light: no numpy, no native library until a name that needs them is used."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, names: Mapping[str, str | tuple[str, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``names`` maps each exported name to the relative module
    that defines it, or to ``(module, its name there)``. A name is imported once, then kept on the package."""

    def __getattr__(name: str) -> Any:
        where = names.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attr = (where, name) if isinstance(where, str) else where
        value = getattr(importlib.import_module(module, package), attr)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
