"""The Jinja environment chat templates are rendered in, as Hugging Face transformers' (and
llama.cpp's minja) offer it, so that templates written for them render here unchanged.

One job: build a sandboxed environment (``trim_blocks``, ``lstrip_blocks``, the
``loopcontrols`` extension for ``{% break %}`` / ``{% continue %}``) with the names templates
expect: ``raise_exception(msg)``, ``strftime_now(fmt)``, and a ``tojson`` filter that keeps
non-ASCII text as it is (``ensure_ascii=False``) and takes ``indent``, ``separators`` and
``sort_keys`` like Python's ``json.dumps``. Pure Python: no native code.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from ..exceptions import InvalidParameterError


class TemplateError(InvalidParameterError):
    """A chat template called ``raise_exception`` (the message is the template's)."""


def _raise_exception(message: str) -> None:
    raise TemplateError(f"chat template: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None, separators: tuple[str, str] | None = None,
            sort_keys: bool = False, ensure_ascii: bool = False) -> str:
    """``value`` as JSON text, non-ASCII characters kept (HF's ``tojson``). Jinja's own filter
    escapes ``<``, ``>``, ``&`` and ``'`` for HTML; a prompt is not HTML, so this one does not."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def template_environment() -> Any:
    """A fresh sandboxed environment for chat templates (see the module's docstring)."""
    import jinja2.ext
    import jinja2.sandbox

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env
