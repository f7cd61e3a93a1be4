#!/usr/bin/env bash
# cpu_variant.sh NAME [NAME ...]: build the patched ggml-cpu alone for a CPU variant of the portable build,
# into build/cpu-variants/NAME/src/libggml-cpu.so (about 30 s each on 2 cores), to measure or test that
# variant on this machine without the 20-minute portable build: preload it in place of the package's,
#   LD_PRELOAD=build/cpu-variants/zen4/src/libggml-cpu.so .venv/bin/pytest tests/test_matmul_few_columns.py
#   .venv/bin/python bench/verify_cost.py --variant native= --variant zen4=build/cpu-variants/zen4/src
# The flags are ggml's own for each variant (ggml/src/CMakeLists.txt, GGML_CPU_ALL_VARIANTS); "native" is
# -march=native. Needs the patched source in vendor/ (any `make install` leaves it there), cmake and ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=vendor/llama.cpp/ggml
[ -d "$SRC" ] || { echo "no $SRC: run make install first" >&2; exit 1; }
# the source package leaves out ggml's pkg-config template, which ggml's CMakeLists configures
[ -f "$SRC/ggml.pc.in" ] || : > "$SRC/ggml.pc.in"
# llamafile's tinyBLAS is on as in the package and the wheel (llama.cpp's top-level default; ggml alone has it off,
# and its variants then took other q8_0 / f16 paths than the ones users get)
common="-DGGML_LLAMAFILE=ON"
base="$common -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_F16C=ON -DGGML_FMA=ON -DGGML_AVX2=ON -DGGML_BMI2=ON"
# with GGML_NATIVE off ggml turns AVX..AVX2 on unless told otherwise: the pre-AVX variants say no to each
none="-DGGML_NATIVE=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF -DGGML_SSE42=OFF"
for name in "$@"; do
    case "$name" in
        native)   flags="$common -DGGML_NATIVE=ON" ;;
        x64)      flags="$common $none" ;;
        sse42)    flags="$common $none -DGGML_SSE42=ON" ;;
        haswell)  flags="$base" ;;
        skylakex) flags="$base -DGGML_AVX512=ON" ;;
        icelake)  flags="$base -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON" ;;
        zen4)     flags="$base -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON" ;;
        alderlake) flags="$base -DGGML_AVX_VNNI=ON" ;;
        *) echo "unknown variant $name (native x64 sse42 haswell skylakex icelake zen4 alderlake)" >&2; exit 2 ;;
    esac
    out=build/cpu-variants/$name
    mkdir -p build/cpu-variants
    # shellcheck disable=SC2086
    cmake -S "$SRC" -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
          -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF $flags > "$out.cmake.log" 2>&1 \
        || { tail -20 "$out.cmake.log"; exit 1; }
    ninja -C "$out" ggml-cpu > "$out.build.log" 2>&1 || { tail -40 "$out.build.log"; exit 1; }
    echo "$out/src/libggml-cpu.so"
done
