"""The structs Python fills by value have the layout the C compiler gives them: a C program built
against the installed patched headers prints sizeof/offsetof of every field, compared with cffi."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from mtp_bindings import low_level

ffi = low_level.ffi
STRUCTS = ["llama_model_params", "llama_context_params", "llama_batch", "ggml_threadpool_params"]


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory) -> dict[str, int]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler is needed for this test")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "llama.h"', "int main(void) {"]
    for s in STRUCTS:
        lines.append(f'    printf("{s} %zu\\n", sizeof(struct {s}));')
        for name, _field in ffi.typeof(f"struct {s}").fields:
            lines.append(f'    printf("{s}.{name} %zu\\n", offsetof(struct {s}, {name}));')
    lines += ["    return 0;", "}"]
    d = tmp_path_factory.mktemp("layout")
    (d / "layout.c").write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-I", str(low_level.include_dir()), "-o", str(d / "layout"), str(d / "layout.c")],
                   check=True, capture_output=True)
    out = subprocess.run([str(d / "layout")], check=True, capture_output=True, text=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


@pytest.mark.parametrize("struct", STRUCTS)
def test_struct_size_matches_the_compiler(c_layout, struct):
    assert ffi.sizeof(f"struct {struct}") == c_layout[struct]


@pytest.mark.parametrize("struct", STRUCTS)
def test_field_offsets_match_the_compiler(c_layout, struct):
    for name, _field in ffi.typeof(f"struct {struct}").fields:
        assert ffi.offsetof(f"struct {struct}", name) == c_layout[f"{struct}.{name}"], name
