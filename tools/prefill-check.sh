#!/usr/bin/env bash
# On the GPU machine: the prefill attention kernels only. Builds test_cuda and bench_prefill
# for sm_90 in build-device (incremental when the machine still holds an earlier build), runs
# the prefill / forward / spill GPU tests, then bench_prefill's attention rows (TFLOP/s per
# kernel and tier, one layer of the Qwen2.5-14B shape over an 8k / 64k prompt); with --hf also
# the GEMM rows and spillway's prefill against HF transformers (tools/hf-prefill-bench.py).
# Through the device tool: run(command="tools/prefill-check.sh [--hf] [--tests GLOB]",
#   carry=[".dev/deps"], timeout_s=...). Logs land in $OUT (or ./out).
# --prebuilt DIR: skip the build and run DIR/test_cuda, DIR/bench_prefill (DIR/spillway),
#   built elsewhere for sm_90 and carried (e.g. carry=["build-p/bin"]).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
hf=0
prebuilt=""
tests='CudaPrefill*:CudaForward.*:CudaSpill.*'
bench_only="prefill attention"
while [ $# -gt 0 ]; do
  case "$1" in
    --hf) hf=1; bench_only=""; shift ;;
    --tests) tests="$2"; shift 2 ;;
    --bench-only) bench_only="$2"; shift 2 ;;
    --prebuilt) prebuilt="$2"; shift 2 ;;
    *) echo "usage: tools/prefill-check.sh [--hf] [--tests GLOB] [--bench-only SUBSTRING] [--prebuilt DIR]"; exit 2 ;;
  esac
done

nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader || true
build=build-device
prefix_args=()
if [ -d .dev/deps ]; then prefix_args=(-DCMAKE_PREFIX_PATH="$PWD/.dev/deps"); fi
targets=(test_cuda bench_prefill)
[ "$hf" = 1 ] && targets+=(spillway)
bin="$build/bin"
start=$(date +%s)
if [ -n "$prebuilt" ]; then
  bin="$prebuilt"
  echo "build: skipped, running binaries from $bin"
elif { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPILLWAY_CUDA_ARCHS=90a "${prefix_args[@]}" &&
       cmake --build "$build" -j16 --target "${targets[@]}"; } >"$out/build.log" 2>&1; then
  echo "build: $(( $(date +%s) - start )) s"
else
  echo "BUILD FAILED after $(( $(date +%s) - start )) s"; grep -E "error|FAILED" "$out/build.log" | head -20
  exit 1
fi

start=$(date +%s)
if [ -n "$tests" ]; then
  "$bin/test_cuda" --gtest_filter="$tests" >"$out/tests.log" 2>&1
  echo "tests rc=$? in $(( $(date +%s) - start )) s: $(grep -E '^\[  (PASSED|FAILED) ' "$out/tests.log" | head -2 | tr '\n' ' ')"
  grep -E "FAILED|Expected|Which is|seed|rel|error" "$out/tests.log" | head -40
fi

echo
echo "== bench_prefill ${bench_only:+--only \"$bench_only\"}"
"$bin/bench_prefill" ${bench_only:+--only "$bench_only"} >"$out/bench-prefill.log" 2>&1
echo "bench_prefill rc=$?"
cat "$out/bench-prefill.log"

if [ "$hf" = 1 ]; then
  echo
  echo "== prefill vs HF transformers (tools/hf-prefill-bench.py --batch 4096, run's long-prompt chunk)"
  PYTHONUNBUFFERED=1 python3 tools/hf-prefill-bench.py --spillway "$bin/spillway" --batch 4096 >"$out/hf-prefill.log" 2>&1
  echo "hf-prefill-bench rc=$?"
  cat "$out/hf-prefill.log"
fi
