#!/usr/bin/env bash
# The README's second command: builds and runs the whole test suite twice, once optimised
# (with the CUDA engine compiled when nvcc exists; `cuda` tests skip without a GPU) and once
# under AddressSanitizer + UndefinedBehaviorSanitizer (CPU only).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
jobs=$(nproc)

tools/build.sh build
(cd build && ctest --output-on-failure -j "$jobs" --timeout 900)

tools/build.sh build-asan -DSPILLWAY_SANITIZE=ON -DSPILLWAY_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j "$jobs" -L cpu --timeout 1800)
