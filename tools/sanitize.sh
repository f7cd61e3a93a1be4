#!/usr/bin/env bash
# Build the patched libllama with AddressSanitizer + UndefinedBehaviorSanitizer and run the MTP C API
# test (attach, async/sync, busy, invalid arguments, NULL pointers, seq_rm / clear / free with a request in
# flight, double attach, contexts created before and after attach) under them.
#
#   tools/sanitize.sh            # uses build/sanitize (persistent), prints the test's summary
#
# Needs the patched source in vendor/llama.cpp (any `pip install .` has put it there).
set -euo pipefail
cd "$(dirname "$0")/.."
SAN=${MTP_SANITIZE:-address,undefined}
BUILD=build/sanitize
python3 build_support/llama_source.py --dest vendor/llama.cpp --patches patches
cmake -S vendor/llama.cpp -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DGGML_NATIVE=ON -DCMAKE_C_FLAGS="-fsanitize=$SAN -fno-omit-frame-pointer" \
    -DCMAKE_CXX_FLAGS="-fsanitize=$SAN -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=$SAN" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=$SAN" > "$BUILD.configure.log"
cmake --build "$BUILD" --target llama > "$BUILD.build.log"
cc -g -O1 -fsanitize="$SAN" -fno-omit-frame-pointer -Ivendor/llama.cpp/include -Ivendor/llama.cpp/ggml/include \
    tests/c/test_mtp_api.c -o "$BUILD/test_mtp_api" -L"$BUILD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$PWD/$BUILD/bin"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
"$BUILD/test_mtp_api" tests/fixtures/dense-target.gguf tests/fixtures/dense-assistant.gguf \
    tests/fixtures/centroid-assistant.gguf 2> "$BUILD/sanitize.stderr" | tail -n 1
status=${PIPESTATUS[0]}
if grep -qE "ERROR: (Address|Leak)Sanitizer|runtime error:" "$BUILD/sanitize.stderr"; then
    echo "sanitizer reports: see $BUILD/sanitize.stderr"; grep -E "ERROR:|runtime error:" "$BUILD/sanitize.stderr" | head
    exit 1
fi
echo "sanitizers: clean ($SAN)"
exit "$status"
