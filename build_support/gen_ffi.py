"""Generate the cffi module source (``_ffi.c``) from the *patched* ``llama.h``.

The cdef is never written by hand: the header is run through the C preprocessor and parsed with
pycparser; every declaration of ``llama.h`` is kept, and of the ggml headers it includes only the
types (plus a few functions listed below). cffi's API mode then compiles the module against the
real header, so the C compiler checks every prototype, struct layout and enum value we use and the
bindings cannot drift from the library.

    python build_support/gen_ffi.py --llama-src vendor/llama.cpp --out build/_ffi.c [--cdef-out F]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import cffi
import pycparser
from pycparser import c_ast, c_generator

from llama_source import PINNED_COMMIT  # build_support/, beside this script: the pin, once

# ggml functions the Python layer calls directly (everything else of ggml stays out of the cdef).
GGML_FUNCTIONS = {
    "ggml_backend_load_all",
    "ggml_backend_load_all_from_path",  # the portable build's CPU variants live next to libllama
    "ggml_backend_load",
    "ggml_backend_register",             # RPC servers (ggml_backend_rpc_add_server's registry)
    "ggml_backend_reg_count",
    "ggml_backend_reg_get",
    "ggml_backend_reg_by_name",
    "ggml_backend_reg_name",
    "ggml_backend_reg_dev_count",
    "ggml_backend_reg_dev_get",
    "ggml_backend_reg_get_proc_address",
    "ggml_backend_dev_backend_reg",
    "ggml_backend_dev_memory",
    "ggml_backend_dev_count",
    "ggml_backend_dev_get",
    "ggml_backend_dev_name",
    "ggml_backend_dev_description",
    "ggml_backend_dev_type",
    "ggml_threadpool_params_default",    # mtp_bindings.native.threadpool (the pool functions: the CPU registry's)
    "ggml_time_us",
    "ggml_type_name",
}

# Types pycparser must know to parse; cffi knows them natively, so they are not emitted.
BUILTIN_TYPEDEFS = """
typedef signed char int8_t; typedef unsigned char uint8_t;
typedef short int16_t; typedef unsigned short uint16_t;
typedef int int32_t; typedef unsigned int uint32_t;
typedef long long int64_t; typedef unsigned long long uint64_t;
typedef unsigned long size_t; typedef long ptrdiff_t; typedef long intptr_t;
typedef unsigned long uintptr_t; typedef _Bool bool; typedef struct _IO_FILE FILE;
typedef struct __va_list_tag va_list;
"""
BUILTIN_NAMES = {"int8_t", "uint8_t", "int16_t", "uint16_t", "int32_t", "uint32_t", "int64_t",
                 "uint64_t", "size_t", "ptrdiff_t", "intptr_t", "uintptr_t", "bool", "FILE", "va_list"}

# C helpers compiled into the module: Python callbacks (extern "Python"), a silent log sink, so that
# ``verbose=False`` never calls into Python from native threads, and the llama.cpp commit the source was
# pinned to (llama.cpp's own llama_version() knows no commit in a build from the sdist, which has no git).
# (a #define's value comes from the header when the module is compiled: "...")
CDEF_EXTRA = """
#define LLAMA_MTP_MAX_STEPS ...
extern "Python" void _mtp_log_callback(enum ggml_log_level, const char *, void *);
extern "Python" bool _mtp_progress_callback(float, void *);
void mtp_log_silent(enum ggml_log_level level, const char * text, void * user_data);
const char * mtp_llama_cpp_commit(void);
int32_t mtp_top_k_superset(const float * row, int32_t n, int32_t k, int32_t * out);
#define MTP_ROUND_MAX_ROWS ...
enum mtp_round_mode { MTP_ROUND_SAMPLE = 0, MTP_ROUND_GREEDY_CHAIN = 1, MTP_ROUND_ARGMAX = 2 };
enum mtp_round_status { MTP_ROUND_ERR_EMPTY = -1, MTP_ROUND_ERR_MEMORY = -2, MTP_ROUND_ERR_CHAIN = -3 };
typedef struct mtp_round {
    struct llama_sampler * chain;
    int32_t n_vocab;
    int32_t mode;
    int32_t top_k;
    int32_t stateful;
    const int32_t * banned;
    int32_t n_banned;
    llama_token_data * data;
    int32_t * ids;
    double * probs;
    float * dense;
    uint64_t * present;
    uint64_t rng[4];
    const uint32_t * masks;
    int32_t mask_words;
} mtp_round;
void mtp_round_seed(mtp_round * r, uint64_t seed);
void mtp_round_uniforms(mtp_round * r, int32_t n, double * out);
void mtp_sampling_use_baseline(int on);
int32_t mtp_row_logprobs(const float * row, int32_t n, int32_t k, int32_t * scratch, int32_t * top_ids,
                         double * top_logprobs, double * out_lse);
int32_t mtp_verify_round(mtp_round * r, const float * const * rows, int32_t n_rows, const int32_t * drafts,
                         const double * u, int32_t * out_token);
"""
# the module's own C helpers (sampling at a 262,144-token vocabulary): C files of ours, beside this script,
# appended in this order (each may use what the ones before it define)
HELPERS_C = [Path(__file__).resolve().parent / name
             for name in ("sampling_prefilter.c", "sampling_exp.c", "sampling_round.c", "sampling_logprobs.c")]
CSRC = """
#include "llama.h"
static void mtp_log_silent(enum ggml_log_level level, const char * text, void * user_data) {
    (void) level; (void) text; (void) user_data;
}
""" + f'static const char * mtp_llama_cpp_commit(void) {{ return "{PINNED_COMMIT}"; }}\n' + "".join(p.read_text() for p in HELPERS_C)


def preprocess(llama_src: Path, cc: str) -> str:
    """The header as the compiler sees it, minus system headers and GNU attributes."""
    with tempfile.TemporaryDirectory() as stub:
        for name in ("stddef.h", "stdint.h", "stdio.h", "stdbool.h", "stdlib.h", "string.h", "stdarg.h"):
            Path(stub, name).write_text("")
        cmd = [cc, "-E", "-nostdinc", f"-I{stub}", f"-I{llama_src / 'ggml' / 'include'}",
               f"-I{llama_src / 'include'}", "-D__attribute__(x)=", "-U__GNUC__", "-DLLAMA_SHARED",
               str(llama_src / "include" / "llama.h")]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def declared_name(node: c_ast.Node) -> str | None:
    if isinstance(node, (c_ast.Decl, c_ast.Typedef)):
        return node.name
    return None


def select_declarations(ast: c_ast.FileAST) -> list[c_ast.Node]:
    """All of llama.h; types (and GGML_FUNCTIONS) of the ggml headers."""
    keep = []
    for node in ast.ext:
        name = declared_name(node)
        if name in BUILTIN_NAMES:
            continue
        origin = Path(node.coord.file).name if node.coord else ""
        is_func = isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl)
        is_var = isinstance(node, c_ast.Decl) and name is not None and not is_func
        if origin == "llama.h":
            if is_var:
                continue
            keep.append(node)
        elif origin.startswith(("ggml", "gguf")):
            if is_func:
                if name in GGML_FUNCTIONS:
                    keep.append(node)
            elif not is_var:
                keep.append(node)
    return keep


class _ArrayDims(c_ast.NodeVisitor):
    """Array lengths given as expressions become ``[...]``: the compiler fills them in (API mode)."""

    def visit_ArrayDecl(self, node: c_ast.ArrayDecl) -> None:
        if node.dim is not None and not isinstance(node.dim, c_ast.Constant):
            node.dim = c_ast.ID("...")
        self.generic_visit(node)


def build_cdef(llama_src: Path, cc: str) -> str:
    text = BUILTIN_TYPEDEFS + preprocess(llama_src, cc)
    parser = pycparser.CParser()
    ast = parser.parse(text, filename="<llama.h>")
    selected = select_declarations(ast)
    for node in selected:
        _ArrayDims().visit(node)
    gen = c_generator.CGenerator()
    lines: list[str] = []
    seen: set[str] = set()
    for node in selected:
        key = (type(node).__name__ + ":" + node.name) if isinstance(node, c_ast.Typedef) else gen.visit(node)
        if key not in seen:  # C11 allows repeated typedefs across ggml headers; cffi does not
            seen.add(key)
            lines.append(gen.visit(node) + ";")
    return "\n".join(lines) + "\n" + CDEF_EXTRA


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-src", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="the C file to write")
    ap.add_argument("--cdef-out", type=Path, default=None, help="also write the cdef text here")
    ap.add_argument("--module", default="mtp_bindings._ffi")
    args = ap.parse_args(argv)

    cdef = build_cdef(args.llama_src, os.environ.get("CC", "cc"))
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    ffi.set_source(args.module, CSRC)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    ffi.emit_c_code(str(args.out))
    if args.cdef_out:
        args.cdef_out.write_text(cdef)
    print(f"[gen-ffi] {args.out} from {args.llama_src / 'include' / 'llama.h'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
