#!/usr/bin/env bash
# Configures and builds spillway. Usage: tools/build.sh [BUILD_DIR] [extra cmake args...]
# CUDA is built when nvcc is found; SPILLWAY_CUDA_ARCHS=90a narrows the architectures.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
shift || true
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
arch_args=()
if [ -n "${SPILLWAY_CUDA_ARCHS:-}" ]; then arch_args=(-DSPILLWAY_CUDA_ARCHS="$SPILLWAY_CUDA_ARCHS"); fi
cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${arch_args[@]}" "$@" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
