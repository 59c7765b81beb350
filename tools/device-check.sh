#!/usr/bin/env bash
# On the GPU machine: build the CUDA tests and kernel benchmarks for sm_90 only, run the
# `cuda` test label, run the kernel benchmarks, and print a short table last.
# Through the device tool: run(command="tools/device-check.sh", carry=[".dev/deps"], timeout_s=600)
#   .dev/deps (optional) holds gtest / nlohmann-json headers, libs and CMake configs copied
#   from a Debian machine, for images that lack them.
# Options: --bench-only SUBSTRING (skip tests, benchmark matching kernels),
#          --sanitize (also run the GPU tests under compute-sanitizer memcheck).
# Logs land in $OUT (or ./out) as build.log, ctest.log, bench.log.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
bench_only=""
sanitize=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bench-only) bench_only="$2"; shift 2 ;;
    --sanitize) sanitize=1; shift ;;
    *) echo "usage: tools/device-check.sh [--bench-only SUBSTRING] [--sanitize]"; exit 2 ;;
  esac
done

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader || true
build=build-device
prefix_args=()
if [ -d .dev/deps ]; then prefix_args=(-DCMAKE_PREFIX_PATH="$PWD/.dev/deps"); fi
start=$(date +%s)
if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPILLWAY_CUDA_ARCHS=90 "${prefix_args[@]}" &&
       cmake --build "$build" -j16 --target test_cuda bench_kernels; } >"$out/build.log" 2>&1; then
  echo "BUILD FAILED"; tail -40 "$out/build.log"; exit 1
fi
echo "build: $(( $(date +%s) - start )) s"

test_status="skipped"
if [ -z "$bench_only" ]; then
  (cd "$build" && ctest -L cuda --output-on-failure --timeout 300) >"$out/ctest.log" 2>&1
  test_rc=$?
  test_status=$(grep -E "tests passed|tests failed" "$out/ctest.log" | tail -1)
  grep -E "Failed|FAILED|error|Expected|Which is|relative error|seed" "$out/ctest.log" | head -60
  if [ "$sanitize" = 1 ]; then
    compute-sanitizer --tool memcheck --error-exitcode 9 "$build/bin/test_cuda" \
      --gtest_filter='CudaAttention.MergedPartials*:CudaSmallOps.*:CudaMatvec.Rejects*' >"$out/sanitize.log" 2>&1
    echo "compute-sanitizer memcheck rc=$? ($(grep -c 'Invalid' "$out/sanitize.log") invalid accesses)"
  fi
fi

bench_args=(--iters 50)
if [ -n "$bench_only" ]; then bench_args+=(--only "$bench_only"); fi
"$build/bin/bench_kernels" "${bench_args[@]}" >"$out/bench.log" 2>&1
bench_rc=$?

echo
echo "== tests: $test_status"
echo "== bench rc=$bench_rc"
sed -n '/^device:/p;/^ceilings:/p;/^| kernel/,$p' "$out/bench.log"
[ $bench_rc -eq 0 ] || tail -5 "$out/bench.log"
exit 0
