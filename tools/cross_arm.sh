#!/usr/bin/env bash
# cross_arm.sh NAME [NAME ...]: build the patched ggml (base + CPU backend) for 64-bit ARM with Debian's cross
# compiler, into build/cross-arm/NAME, to run the suite's ggml programs (`pytest -m ggml_program`) on it under
# qemu-user: the ARM kernels our patches touch (NEON, dotprod, i8mm, SVE at 256 bits) checked for correctness and
# batch invariance on an x86 machine. Emulated, so the timings mean nothing. About 40 s each on 2 cores.
#   apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user-static
#   bash tools/cross_arm.sh neon dotprod i8mm sve
#   MTP_BINDINGS_CROSS_GGML=build/cross-arm/i8mm .venv/bin/pytest -m ggml_program
# The names are ARM levels as ggml's ARM variants build them (GGML_CPU_ARM_ARCH); qemu runs each on its "max"
# CPU, which has all of them. Needs the patched source in vendor/ (any `make install` leaves it there).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=vendor/llama.cpp/ggml
[ -d "$SRC" ] || { echo "no $SRC: run make install first" >&2; exit 1; }
for tool in aarch64-linux-gnu-gcc aarch64-linux-gnu-g++ qemu-aarch64-static; do
    command -v "$tool" > /dev/null || { echo "no $tool: apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user-static" >&2; exit 1; }
done
# the source package leaves out ggml's pkg-config template, which ggml's CMakeLists configures
[ -f "$SRC/ggml.pc.in" ] || : > "$SRC/ggml.pc.in"
for name in "$@"; do
    cpu=max
    case "$name" in
        neon)    arch=armv8-a ;;
        dotprod) arch=armv8.2-a+dotprod+fp16 ;;
        i8mm)    arch=armv8.6-a+dotprod+i8mm+fp16 ;;
        # 256-bit vectors, as Graviton3 / Neoverse V1 have (qemu's own default, 512 bits, is A64FX's: there the
        # pin's 2x2 SVE vec_dot of q4_K / q6_K, which has code for 128 and 256 bits only, gives wrong products)
        sve)     arch=armv8.6-a+dotprod+i8mm+fp16+sve; cpu=max,sve-default-vector-length=32 ;;
        *) echo "unknown ARM level $name (neon dotprod i8mm sve)" >&2; exit 2 ;;
    esac
    out=build/cross-arm/$name
    mkdir -p build/cross-arm
    # llamafile's tinyBLAS on, as in the package
    cmake -S "$SRC" -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
          -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
          -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
          -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH="$arch" -DGGML_LLAMAFILE=ON \
          -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF > "$out.cmake.log" 2>&1 \
        || { tail -20 "$out.cmake.log"; exit 1; }
    ninja -C "$out" ggml ggml-base ggml-cpu > "$out.build.log" 2>&1 || { tail -40 "$out.build.log"; exit 1; }
    # what tests/ggml_programs.py needs to build a program against this ggml and run it
    cat > "$out/cross.env" <<EOF
CC=aarch64-linux-gnu-gcc
INCLUDE=$PWD/$SRC/include
LIB=$PWD/$out/src
RUN=qemu-aarch64-static -L /usr/aarch64-linux-gnu -cpu $cpu
EOF
    echo "$out"
done
