#!/usr/bin/env bash
# Build the patched libllama with AddressSanitizer + UndefinedBehaviorSanitizer and run under them:
#  1. the MTP C API test (attach, async/sync, busy, invalid arguments, NULL pointers, seq_rm / clear / free
#     with a request in flight, double attach, contexts created before and after attach);
#  2. the stateful property test of the C API (tests/test_c_api_stateful.py, its larger profile), through
#     the installed package's cffi module with the sanitized libraries put in front of the bundled ones.
#
#   tools/sanitize.sh                    # uses build/sanitize-address-undefined (persistent), prints each summary
#   MTP_SANITIZE=thread tools/sanitize.sh  # ThreadSanitizer instead (-fsanitize=thread)
#   MTP_C_API_STATEFUL=default tools/sanitize.sh  # the stateful test's shorter profile (the suite's)
#
# Needs the patched source in vendor/llama.cpp (any `pip install .` has put it there).
set -euo pipefail
cd "$(dirname "$0")/.."
SAN=${MTP_SANITIZE:-address,undefined}
BUILD=build/sanitize-${SAN//,/-}  # one persistent build per sanitizer set
python3 build_support/llama_source.py --dest vendor/llama.cpp --patches patches
# ThreadSanitizer cannot see libgomp's (uninstrumented) barriers and reports every OpenMP worker's access as
# a race: under TSAN, ggml's own thread pool (atomics TSAN understands) replaces OpenMP
OPENMP=ON
case "$SAN" in *thread*) OPENMP=OFF ;; esac
cmake -S vendor/llama.cpp -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DGGML_NATIVE=ON -DGGML_OPENMP="$OPENMP" -DCMAKE_C_FLAGS="-fsanitize=$SAN -fno-omit-frame-pointer" \
    -DCMAKE_CXX_FLAGS="-fsanitize=$SAN -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=$SAN" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=$SAN" > "$BUILD.configure.log"
cmake --build "$BUILD" --target llama > "$BUILD.build.log"
cc -g -O1 -fsanitize="$SAN" -fno-omit-frame-pointer -Ivendor/llama.cpp/include -Ivendor/llama.cpp/ggml/include \
    tests/c/test_mtp_api.c -o "$BUILD/test_mtp_api" -L"$BUILD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$PWD/$BUILD/bin"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# the accepted race of the append contract (llama.h, "data races"; patches/README.md, Verification): the
# target's set_rows of appended cells against the drafting graph's reads of the same, masked, cells
printf 'race:ggml_compute_forward_set_rows\n' > "$BUILD/tsan.supp"
export TSAN_OPTIONS="halt_on_error=0:report_signal_unsafe=0:suppressions=$PWD/$BUILD/tsan.supp"
"$BUILD/test_mtp_api" tests/fixtures/dense-target.gguf tests/fixtures/dense-assistant.gguf \
    tests/fixtures/centroid-assistant.gguf 2> "$BUILD/sanitize.stderr" | tail -n 1
status=${PIPESTATUS[0]}

# 2. the stateful property test: the interpreter is not instrumented, so the sanitizer runtime is preloaded
#    and the sanitized libllama/ggml are found first (the cffi module's RUNPATH comes after LD_LIBRARY_PATH);
#    pytest does not capture (-s): a passing test's captured output, sanitizer reports included, is dropped
case "$SAN" in
    *thread*) RUNTIME=$(cc -print-file-name=libtsan.so) ;;
    *address*) RUNTIME=$(cc -print-file-name=libasan.so) ;;
    *) RUNTIME= ;;
esac
# the interpreter (and its pytest) itself, not a launcher: a pyenv shim is a bash script that loads pyenv's own shared
# object into bash, which crashed at startup with GCC 12's TSAN runtime preloaded (measured here)
PYTHON=$(python3 -c 'import sys; print(sys.executable)')
if [ -n "$RUNTIME" ] && ! LD_PRELOAD=$RUNTIME ASAN_OPTIONS=detect_leaks=0 "$PYTHON" -c pass 2> /dev/null; then
    echo "stateful test skipped: $PYTHON does not start with $RUNTIME preloaded"
    [ "$status" -eq 0 ] && echo "sanitizers: clean ($SAN, C test only)"
    exit "$status"
fi
set +e
LD_PRELOAD=$RUNTIME LD_LIBRARY_PATH="$PWD/$BUILD/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:halt_on_error=1 \
    MTP_C_API_STATEFUL=${MTP_C_API_STATEFUL:-long} "$(dirname "$PYTHON")/pytest" -q -s -p no:cacheprovider tests/test_c_api_stateful.py \
    > "$BUILD/stateful.stdout" 2> "$BUILD/stateful.stderr"
stateful=$?
set -e
tail -n 1 "$BUILD/stateful.stdout"

if grep -qE "ERROR: (Address|Leak)Sanitizer|runtime error:|WARNING: ThreadSanitizer|ThreadSanitizer: reported" \
        "$BUILD/sanitize.stderr" "$BUILD/stateful.stderr" "$BUILD/stateful.stdout"; then
    echo "sanitizer reports: see $BUILD/sanitize.stderr and $BUILD/stateful.std{out,err}"
    grep -hE "ERROR:|runtime error:|WARNING: ThreadSanitizer" "$BUILD/sanitize.stderr" "$BUILD/stateful.stderr" \
        "$BUILD/stateful.stdout" | head
    exit 1
fi
echo "sanitizers: clean ($SAN)"
[ "$status" -eq 0 ] && exit "$stateful"
exit "$status"
