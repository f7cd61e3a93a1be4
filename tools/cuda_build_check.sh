#!/usr/bin/env bash
# cuda_build_check.sh [ARCH]: compile the patched llama.cpp with -DGGML_CUDA=ON for one GPU architecture
# (default 90: Hopper, the H200 of DEVELOPERS.md) on a machine without a GPU, to catch a patch that breaks the
# CUDA build before a GPU machine is lent. Builds libllama and ggml-cuda (CUB's TOP_K path included where the
# toolkit has CCCL) in build/cuda-check; prints the time and the result. Not part of `make test` (20-60 min
# on 2 cores: ggml-cuda is ~190 .cu files).
#
# The toolkit: nvcc under $CUDA_HOME (/usr/local/cuda) or on PATH, as the toolkit's layout (targets/...) that
# nvcc and CMake expect. ggml-cuda links cuBLAS; a toolkit without it (this machine's /usr/local/cuda) gets
# cuBLAS from PyPI (nvidia-cublas), handed to CMake by path.
# Needs the patched source in vendor/ (any `make install` leaves it there), cmake and ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${1:-90}
SRC=vendor/llama.cpp
OUT=build/cuda-check
[ -d "$SRC/src" ] || { echo "no $SRC: run make install first" >&2; exit 1; }

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$CUDA_HOME/bin/nvcc" ] && command -v nvcc >/dev/null; then
    CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
fi
[ -x "$CUDA_HOME/bin/nvcc" ] || { echo "[cuda-check] no nvcc (on PATH or under \$CUDA_HOME): install a CUDA toolkit" >&2; exit 1; }
EXTRA=()
# ggml-cuda links the driver (libcuda.so, for its virtual memory pool) unless GGML_CUDA_NO_VMM: a toolkit without
# the driver's stub (this machine's) compiles everything else the same, with the pool of cudaMalloc'd blocks
if ! find "$CUDA_HOME/" -name 'libcuda.so*' 2>/dev/null | grep -q .; then
    echo "[cuda-check] no libcuda.so (driver or stub) under $CUDA_HOME: building with GGML_CUDA_NO_VMM=ON"
    EXTRA+=(-DGGML_CUDA_NO_VMM=ON)
fi
if ! ls "$CUDA_HOME"/lib64/libcublas.so* >/dev/null 2>&1 && ! ls "$CUDA_HOME"/lib/libcublas.so* >/dev/null 2>&1; then
    echo "[cuda-check] $CUDA_HOME has no cuBLAS: taking it from PyPI (nvidia-cublas)"
    venv=build/cuda-toolkit-venv
    [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check nvidia-cublas
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    cublas=$(find "$site/nvidia" -name 'libcublas.so.*' | head -1)
    cublaslt=$(find "$site/nvidia" -name 'libcublasLt.so.*' | head -1)
    inc=$(dirname "$(find "$site/nvidia" -name 'cublas_v2.h' | head -1)")
    # FindCUDAToolkit takes cached library paths as found; the headers go on the include path
    EXTRA+=(-DCUDA_cublas_LIBRARY="$cublas" -DCUDA_cublasLt_LIBRARY="$cublaslt"
            -DCMAKE_CUDA_FLAGS="-I$inc" -DCMAKE_CXX_FLAGS="-I$inc" -DCMAKE_C_FLAGS="-I$inc")
fi
echo "[cuda-check] toolkit: $CUDA_HOME ($("$CUDA_HOME/bin/nvcc" --version | tail -1))"

start=$(date +%s)
rc=0
cmake -S "$SRC" -B "$OUT" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
      -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DCUDAToolkit_ROOT="$CUDA_HOME" \
      -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" -DGGML_NATIVE=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DLLAMA_BUILD_COMMON=OFF -DLLAMA_OPENSSL=OFF "${EXTRA[@]}" > "$OUT.cmake.log" 2>&1 || rc=$?
if [ $rc -ne 0 ]; then
    tail -30 "$OUT.cmake.log"
    echo "[cuda-check] configure FAILED after $(( $(date +%s) - start )) s"
    exit $rc
fi
grep -E "CUDA Toolkit found|Using CUDA architectures|CUB" "$OUT.cmake.log" || true
ninja -C "$OUT" llama ggml-cuda > "$OUT.build.log" 2>&1 || rc=$?
took=$(( $(date +%s) - start ))
if [ $rc -ne 0 ]; then
    grep -E "error|FAILED" "$OUT.build.log" | head -30
    echo "[cuda-check] build FAILED after $took s (log: $OUT.build.log)"
    exit $rc
fi
echo "[cuda-check] OK: libllama and ggml-cuda for sm_$ARCH built in $took s ($(nproc) cores; log: $OUT.build.log)"
