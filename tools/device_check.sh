#!/usr/bin/env bash
# device_check.sh prepare | run [build|test|bench ...]: the GPU check of issue 28, for when a GPU machine is lent
# (DEVELOPERS.md: one H200, nvcc, CMake, ninja, 16 cores, nothing reachable from it; 15 minutes of device time in
# all, 10 a command).
#
#   prepare   here, with the patched source in vendor/ (any `make install`) and PyPI reachable: writes .device/
#             (git-excluded): the patched llama.cpp tree trimmed to what the build compiles, and the wheels of the
#             Python packages the GPU machine lacks (cffi, fastapi, uvicorn, openai, llguidance, ...; Python 3.12).
#   run       there, in the repo root, through the device tool:
#               run(command="bash tools/device_check.sh run", carry=[".device"], timeout_s=590)
#             build: the package with -DGGML_CUDA=ON for sm_90 (and upstream's llama-server) into build/cuda,
#                    installed under /tmp/mtp (a warm machine keeps build/: a second call only rebuilds changes);
#             test:  tests/test_vulkan.py with MTP_TEST_DEVICE=CUDA0 (every layer of target and assistant on the
#                    GPU: MTP greedy = plain greedy, drafts as on the CPU, KV edits in flight, the server);
#             bench: bench/device_speed.py: plain vs MTP tokens/s with every layer offloaded, ours and upstream's
#                    llama-server draft-mtp, on the bundled pair and (when time allows) the E2B-sized one.
#             Everything lands in $OUT (logs, JUnit XML, bench JSON); each step stops before the command's limit.
#
# A dry run here (`bash tools/device_check.sh run build` with CUDA_ARCH unset and no GPU) gets as far as the
# configure step; the test step then skips with "no device CUDA0".
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEV=.device
PY=${PYTHON:-python3}
PYVER=${DEVICE_PYTHON_VERSION:-3.12}
# the packages the GPU machine's image lacks, or has older than ours needs (/work/.library/device/KINDS.md lists
# what it has), with what they need in turn; pinned to the dev venv's versions where there is one (the set the suite
# passes with: fastapi and openai each pull newer packages than the image's)
WHEELS="cffi pycparser gguf llguidance fastapi starlette uvicorn openai pydantic pydantic-core annotated-types
        annotated-doc typing-inspection typing-extensions opentelemetry-api httpx2 httpcore2 truststore jiter distro
        sniffio h11 click anyio"
VENV_PY=${VENV_PY:-.venv/bin/python}

prepare() {
    [ -f vendor/llama.cpp/.mtp-patches.json ] || { echo "no patched vendor/llama.cpp: run make install first" >&2; exit 1; }
    mkdir -p "$DEV/whl"
    grep -qx "/$DEV/" .git/info/exclude 2>/dev/null || echo "/$DEV/" >> .git/info/exclude
    # what CMake compiles (no docs, models, tests, examples): with the stamps, the build takes the tree as is
    tar -czf "$DEV/llama-src.tar.gz" -C vendor \
        --exclude=llama.cpp/docs --exclude=llama.cpp/models --exclude=llama.cpp/tests --exclude=llama.cpp/benches \
        --exclude=llama.cpp/examples --exclude=llama.cpp/.mtp-pristine --exclude='*.png' --exclude='*.gguf' llama.cpp
    rm -f "$DEV"/whl/*.whl
    local reqs=() name pin frozen=""
    [ -x "$VENV_PY" ] && frozen=$("$VENV_PY" -m pip freeze 2>/dev/null || true)
    for name in $WHEELS; do
        pin=$(grep -i -E "^${name//-/[-_]}==" <<< "$frozen" | head -1 | cut -d= -f3 || true)
        reqs+=("$name${pin:+==$pin}")
    done
    local plats=() n
    for n in 17 24 27 28 31 34 35 39; do plats+=(--platform "manylinux_2_${n}_x86_64"); done
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version "$PYVER" \
        --implementation cp "${plats[@]}" --platform manylinux2014_x86_64 -d "$DEV/whl" "${reqs[@]}"
    du -sh "$DEV"/llama-src.tar.gz "$DEV/whl"
}

left() { echo $(( DEADLINE - $(date +%s) )); }

step_build() {
    mkdir -p vendor
    if [ ! -f vendor/llama.cpp/.mtp-patches.json ] || [ "$DEV/llama-src.tar.gz" -nt vendor/llama.cpp/.mtp-patches.json ]; then
        tar -xzf "$DEV/llama-src.tar.gz" -C vendor
    fi
    local start; start=$(date +%s)
    local args="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} -DGGML_NATIVE=ON"
    CMAKE_ARGS="$args" MTP_BUILD_LLAMA_SERVER=ON CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        timeout "$(left)" "$PY" -m pip install -v --no-build-isolation --no-deps --no-index --disable-pip-version-check \
        --target /tmp/mtp --upgrade -C build-dir=build/cuda . > "$OUT/build.log" 2>&1
    echo "[device-check] build: $(( $(date +%s) - start )) s ($(nproc) cores)" | tee -a "$OUT/summary.txt"
}

step_test() {
    local start; start=$(date +%s)
    # the build's own checks first (the bundled libraries, what they export), then the tier on the device
    PATH="/tmp/mtp/bin:$PATH" timeout "$(left)" "$PY" -P -m pytest -p no:cacheprovider tests/test_build.py -rs -q \
        > "$OUT/test.log" 2>&1 || echo "[device-check] build tests: rc $?" >> "$OUT/summary.txt"
    MTP_TEST_DEVICE=${MTP_TEST_DEVICE:-CUDA0} PATH="/tmp/mtp/bin:$PATH" \
        timeout "$(left)" "$PY" -P -m pytest -p no:cacheprovider -m vulkan tests/test_vulkan.py -rs -q \
        --junitxml=/tmp/test.xml >> "$OUT/test.log" 2>&1 || echo "[device-check] tests: rc $?" >> "$OUT/summary.txt"
    tail -3 "$OUT/test.log" | tee -a "$OUT/summary.txt"
    echo "[device-check] test: $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
}

step_bench() {
    local start; start=$(date +%s)
    # plain vs MTP, every layer on the GPU (-P: the installed package, not the checkout): ours in process and upstream's llama-server (plain, draft-mtp)
    for pair in ${BENCH_PAIRS:-tiny e2b}; do
        [ "$(left)" -gt 60 ] || { echo "[device-check] no time left for the $pair bench" | tee -a "$OUT/summary.txt"; break; }
        PATH="/tmp/mtp/bin:$PATH" timeout "$(left)" "$PY" -P bench/device_speed.py --device "${MTP_TEST_DEVICE:-CUDA0}" \
            --pair "$pair" --out "$OUT/speed-$pair.json" > /dev/null 2>> "$OUT/bench.log" \
            || echo "[device-check] $pair bench: rc $?" | tee -a "$OUT/summary.txt"
    done
    echo "[device-check] bench: $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
}

step_diag() {
    # where a load on the device fails: llama.cpp's log, Python's and (cuda-gdb) the native stack, upstream's
    # llama-server on the same file, and the load with the CPU's extra buffer types off or no layer offloaded
    local start; start=$(date +%s) log="$OUT/diag.log" dev=${MTP_TEST_DEVICE:-CUDA0}
    local model=tests/fixtures/dense-target.gguf
    { lscpu | grep -E 'Model name|Flags' | cut -c1-400; } >> "$log" 2>&1
    # the toolchain and what each bundled library exports of the C++ runtime (issue 28's first H200 run crashed in a
    # load inside an ostream insertion bound to libggml-cuda's own copy; it should export none)
    {
        echo "== toolchain"; command -v gcc g++; g++ --version | head -1; env | grep -E '^(LDFLAGS|CXXFLAGS|CFLAGS|CUDAFLAGS|LD_)=' || true
        echo "== ggml-cuda's link"; grep -A12 '^build [^:]*libggml-cuda.so[.0-9]*:' build/cuda/build.ninja \
            | grep -E 'LINK_FLAGS|LINK_LIBRARIES' | cut -c1-1500 || true
        echo "== C++ runtime symbols each library exports (std::locale, ios_base, codecvt, __throw_bad_alloc, ostream::_M_insert)"
        for so in /tmp/mtp/mtp_bindings/lib/*.so /tmp/mtp/mtp_bindings/_ffi*.so; do
            echo "$(basename "$so"): $(nm -D --defined-only "$so" | awk '{print $NF}' \
                | grep -c -E '^(_ZNS?K?St6locale|_ZNK?St8ios_base|_ZNK?St7codecvt|_ZSt17__throw_bad_allocv|_ZSt20__throw_length_errorPKc|_ZNSo9_M_insert)' || true)"
            { readelf -d "$so" | grep -E 'NEEDED|RUNPATH' | awk '{print "   " $NF}' | tr '\n' ' '; echo; } || true
        done
    } >> "$log" 2>&1
    cat > /tmp/diag_load.py <<PYEOF
import faulthandler, logging, sys
faulthandler.enable()
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s: %(message)s")
from mtp_bindings import Model
from mtp_bindings.native.devices import list_devices
print("devices:", [d.name for d in list_devices()], flush=True)
kw = {"n_gpu_layers": -1, "devices": "$dev", "verbose": True}
if sys.argv[1] == "norepack":
    kw["repack"] = False
elif sys.argv[1] == "ngl0":
    kw["n_gpu_layers"] = 0
with Model("$model", **kw) as m:
    print("LOADED", sys.argv[1], flush=True)
PYEOF
    local v rc
    for v in default norepack ngl0; do
        rc=0; timeout 60 "$PY" -P /tmp/diag_load.py "$v" >> "$log" 2>&1 || rc=$?
        echo "[device-check] diag load $v: rc $rc" | tee -a "$OUT/summary.txt" >> "$log"
    done
    local srv=/tmp/mtp/mtp_bindings/bin/llama-server
    rc=0; timeout 20 "$srv" -m "$model" -ngl 99 -dev "$dev" --port 18181 >> "$log" 2>&1 || rc=$?
    echo "[device-check] diag upstream llama-server load (124 = still serving): rc $rc" | tee -a "$OUT/summary.txt"
    local gdb; gdb=$(command -v cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb)
    if [ -x "$gdb" ]; then
        timeout 120 "$gdb" -q -batch -ex 'set pagination off' -ex 'set confirm off' -ex run -ex bt -ex 'info threads' \
            --args "$(command -v "$PY")" -P /tmp/diag_load.py default >> "$log" 2>&1 || true
    fi
    echo "[device-check] diag: $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
}

run() {
    : "${OUT:=$ROOT/build/device-out}"
    mkdir -p "$OUT"
    # 10 minutes a command: stop each step with a margin for the files to come back
    DEADLINE=$(( $(date +%s) + ${DEVICE_CHECK_SECONDS:-560} ))
    if [ -d "$DEV/whl" ] && ls "$DEV"/whl/*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$DEV"/whl/*.whl
        export PYTHONPATH=/tmp/site
    fi
    export PYTHONPATH=/tmp/mtp${PYTHONPATH:+:$PYTHONPATH}
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1 || true
    local steps=("$@")
    [ ${#steps[@]} -gt 0 ] || steps=(build test bench)
    for s in "${steps[@]}"; do
        [ "$(left)" -gt 30 ] || { echo "[device-check] no time left for $s" | tee -a "$OUT/summary.txt"; break; }
        "step_$s"
    done
}

case "${1:-}" in
    prepare) prepare ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 prepare | run [build|diag|test|bench ...]" >&2; exit 2 ;;
esac
