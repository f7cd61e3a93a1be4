"""``generate`` / ``chat``'s ``@overload`` faces say what their implementation takes, and ``chat`` takes
``generate``'s keywords.

Pure: read from the source with ``ast``, nothing of ``mtp_bindings`` imported. A type checker reads
the overloads and ``help()`` the implementation, so a keyword added to one and not the others, or a
default changed in one place, would show a user two different functions; nothing else would notice
(the overloads never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GENERATION = Path(__file__).resolve().parent.parent / "mtp_bindings" / "generation"
FACES = {"generate": GENERATION / "driver.py", "chat": GENERATION / "chat.py"}
STREAM = "stream"  # the one parameter the faces differ on: its annotation says which result comes back
STREAM_FACES = {("Literal[False]", "False"), ("Literal[True]", None), ("bool", None)}
# chat's own keywords (what it renders the prompt from), and where it differs from generate on purpose:
# a chat prompt is tokenized by CHAT_TOKENIZE's rule, and its special tokens default to the template's
# reply markers (None: look them up), where generate's default to none
CHAT_ONLY = {"tools", "chat_template", "chat_template_kwargs"}
CHAT_DIFFERS = {"add_special", "parse_special", "special_tokens"}


def definitions(name: str) -> tuple[list[ast.FunctionDef], ast.FunctionDef]:
    """``name``'s ``@overload`` faces and its implementation, top level of its module."""
    tree = ast.parse(FACES[name].read_text(), str(FACES[name]))
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    faces = [d for d in defs if any(ast.unparse(dec) in ("overload", "typing.overload") for dec in d.decorator_list)]
    impls = [d for d in defs if d not in faces]
    assert len(impls) == 1, f"{name}: {len(impls)} implementations"
    return faces, impls[0]


def _text(node: ast.expr | None) -> str | None:
    return None if node is None else ast.unparse(node)


def positional(fn: ast.FunctionDef) -> list[tuple[str, str | None]]:
    assert not fn.args.defaults and not fn.args.posonlyargs and fn.args.vararg is None and fn.args.kwarg is None
    return [(a.arg, _text(a.annotation)) for a in fn.args.args]


def keywords(fn: ast.FunctionDef) -> dict[str, tuple[str | None, str | None]]:
    """Keyword-only parameters in order: name -> (annotation, default) as source text."""
    args = fn.args
    return {a.arg: (_text(a.annotation), _text(d)) for a, d in zip(args.kwonlyargs, args.kw_defaults)}


@pytest.mark.parametrize("name", sorted(FACES))
def test_each_overload_has_the_implementations_parameters(name):
    faces, impl = definitions(name)
    assert len(faces) == 3, f"{name}: stream=False / True / a bool, {len(faces)} faces"
    want = keywords(impl)
    assert want[STREAM] == ("bool", "False")
    seen_stream = set()
    for face in faces:
        assert positional(face) == positional(impl), f"{name} (line {face.lineno}): positional parameters"
        got = keywords(face)
        assert list(got) == list(want), f"{name} (line {face.lineno}): keywords differ from the implementation's"
        differ = {k: (got[k], want[k]) for k in want if k != STREAM and got[k] != want[k]}
        assert not differ, f"{name} (line {face.lineno}): annotation or default differs: {differ}"
        seen_stream.add(got[STREAM])
    assert seen_stream == STREAM_FACES, seen_stream


def test_chat_takes_generates_keywords():
    _, generate = definitions("generate")
    _, chat = definitions("chat")
    g, c = keywords(generate), keywords(chat)
    assert set(c) - set(g) == CHAT_ONLY, "chat's own keywords changed: update CHAT_ONLY (and chat's forwarding)"
    assert set(g) <= set(c), f"chat lacks {set(g) - set(c)} of generate's keywords"
    differ = {k for k in g if g[k] != c[k]}
    assert differ == CHAT_DIFFERS, f"chat and generate differ on {differ ^ CHAT_DIFFERS} (or no longer on it)"
    # the same order, chat's own first: help() lists them alike
    assert [k for k in c if k in g] == list(g)


def test_chat_forwards_every_generate_keyword():
    """chat's one call of generate passes each of generate's keywords on (none left at generate's default)."""
    _, generate = definitions("generate")
    _, chat = definitions("chat")
    calls = [n for n in ast.walk(chat) if isinstance(n, ast.Call) and ast.unparse(n.func) == "generate"]
    assert len(calls) == 1
    assert {k.arg for k in calls[0].keywords} == set(keywords(generate))
