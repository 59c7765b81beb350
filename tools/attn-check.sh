#!/usr/bin/env bash
# On the GPU machine, one call for decode-attention work: build test_cuda, bench_kernels and
# spillway for sm_90 (build-device), run the attention / forward / spill GPU tests, the
# attention rows of the kernel bench, then the issue-5 engine decode line at 64k.
# Through the device tool: run(command="tools/attn-check.sh [--no-tests] [--no-engine]
#   [--filter GLOB] [--ncu KERNEL_REGEX@BENCH_FILTER]" (NCU_SKIP=N: launches skipped first), carry=[".dev/deps"], timeout_s=600)
#   --prebuilt DIR: skip the build, run DIR's binaries (built elsewhere for sm_90 and carried).
# Logs in $OUT (or ./out): build.log, tests.log, bench.log, engine.log, ncu.log.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
tests=1
engine=1
filter='CudaAttention.*:CudaForward.*:CudaSpill.*'
ncu_pair=""
prebuilt=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-tests) tests=0; shift ;;
    --no-engine) engine=0; shift ;;
    --filter) filter="$2"; shift 2 ;;
    --ncu) ncu_pair="$2"; shift 2 ;;
    --prebuilt) prebuilt="$2"; shift 2 ;;
    *) echo "usage: tools/attn-check.sh [--no-tests] [--no-engine] [--filter GLOB] [--ncu REGEX@FILTER]"; exit 2 ;;
  esac
done
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
build=build-device
prefix_args=()
if [ -d .dev/deps ]; then prefix_args=(-DCMAKE_PREFIX_PATH="$PWD/.dev/deps"); fi
targets=(bench_kernels)
[ "$tests" = 1 ] && targets+=(test_cuda)
[ "$engine" = 1 ] && targets+=(spillway)
if [ -n "$prebuilt" ]; then
  el "build skipped: $prebuilt"
elif ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPILLWAY_CUDA_ARCHS=90a "${prefix_args[@]}" &&
       cmake --build "$build" -j16 --target "${targets[@]}"; } >"$out/build.log" 2>&1; then
  el "BUILD FAILED"; grep -E "error|FAILED" "$out/build.log" | head -20; exit 1
else
  el "build ok"
fi
bin=${prebuilt:-$build/bin}
if [ "$tests" = 1 ]; then
  "$bin/test_cuda" --gtest_filter="$filter" >"$out/tests.log" 2>&1
  el "test_cuda rc=$?"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|error|Which is|seed" "$out/tests.log" | head -40
fi
"$bin/bench_kernels" --iters 50 --only attention >"$out/bench.log" 2>&1
el "bench_kernels rc=$?"
sed -n '/^device:/p;/^ceilings:/p;/^| kernel/,$p' "$out/bench.log"
if [ -n "$ncu_pair" ]; then
  ncu --clock-control none --kernel-name "regex:${ncu_pair%%@*}" --launch-skip "${NCU_SKIP:-3}" --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section LaunchStats \
    "$bin/bench_kernels" --iters 5 --only "${ncu_pair#*@}" >"$out/ncu.log" 2>&1
  el "ncu rc=$?"
  grep -vE "^ +-+|^\s*$|^==PROF==|^\| |^device:|^ceilings:" "$out/ncu.log" | cut -c1-160 | head -120
fi
if [ "$engine" = 1 ]; then
  "$bin/spillway" bench --synthetic qwen2.5-14b --wtype q8_0 -p 0 -n 64 -d 65536 -ctk f16,q8_0,q4_0 \
    -ctv f16,q8_0,q4_0 >"$out/engine.log" 2>&1
  el "engine bench rc=$?"
  tail -20 "$out/engine.log"
fi
