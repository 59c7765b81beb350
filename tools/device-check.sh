#!/usr/bin/env bash
# On the GPU machine: build the CUDA tests and kernel benchmarks for sm_90a only, run the
# `cuda` test label, run the kernel benchmarks, and print a short table last.
# Through the device tool: run(command="tools/device-check.sh", carry=[".dev/deps"], timeout_s=600)
#   .dev/deps (optional) holds gtest / nlohmann-json headers, libs and CMake configs copied
#   from a Debian machine, for images that lack them.
# Options: --bench-only SUBSTRING (skip tests, benchmark matching kernels),
#          --sanitize (also run the GPU tests under compute-sanitizer memcheck),
#          --ncu "KERNEL_REGEX@BENCH_FILTER,..." (profile one launch of each kernel within the
#          benchmarks selected by the filter, with Nsight Compute, clocks left alone: ncu.log),
#          --filter GTEST_GLOB (run only these GPU tests, e.g. 'CudaMatvec.*:CudaAttention.*'),
#          --hf (also the prefill block at the end: bench_prefill, then spillway vs HF
#          transformers prefill at 8k and 64k tokens, tools/hf-prefill-bench.py, the prefill
#          lab A/Bs and an 8k op-times table; ~3 minutes),
#          --prebuilt DIR (skip the build; run DIR/test_cuda and DIR/bench_kernels, built
#          elsewhere for sm_90). If the build fails and .dev/prebuilt exists, it is used.
#          --engine-only (no tests, no kernel benchmarks, no probe / plan / gate block: only the
#          engine block, i.e. spillway bench and its lab A/Bs, ~4 minutes).
#          --quick (the GPU tests without the lab-knob reruns, then only the engine's main table:
#          ~2.5 minutes with --prebuilt; for a session's last check when device time is short.
#          Nothing after the table runs, --hf included).
#          --ws (only the warp-specialized decode attention's check, sessions 55-56: the attention
#          tests, the forward / attention / spill suites under SPILLWAY_ATTN_WS=1, the mma and ws
#          kernel rows, and engine A/Bs of SPILLWAY_ATTN_WS=0 against the default and against =1,
#          and of =1 against =1 with SPILLWAY_ATTN_WS_BLOCK_K=1; ~4 minutes).
# Logs land in $OUT (or ./out) as build.log, ctest.log, bench.log.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
bench_only=""
sanitize=0
prebuilt=""
ncu_regex=""
test_filter=""
hf=0
engine_only=0
quick=0
ws=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bench-only) bench_only="$2"; shift 2 ;;
    --sanitize) sanitize=1; shift ;;
    --prebuilt) prebuilt="$2"; shift 2 ;;
    --ncu) ncu_regex="$2"; shift 2 ;;
    --filter) test_filter="$2"; shift 2 ;;
    --hf) hf=1; shift ;;
    --engine-only) engine_only=1; shift ;;
    --quick) quick=1; shift ;;
    --ws) ws=1; shift ;;
    *) echo "usage: tools/device-check.sh [--bench-only SUBSTRING] [--sanitize] [--ncu LIST] [--filter GLOB] [--hf] [--prebuilt DIR] [--engine-only] [--quick] [--ws]"; exit 2 ;;
  esac
done

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader || true
build=build-device
prefix_args=()
if [ -d .dev/deps ]; then prefix_args=(-DCMAKE_PREFIX_PATH="$PWD/.dev/deps"); fi
start=$(date +%s)
bin="$build/bin"
if [ -n "$prebuilt" ]; then
  bin="$prebuilt"
  export SPILLWAY_TEST_BINARY="$(realpath "$bin")/spillway"  # the CLI tests' binary (tests/cuda/run_plan_test.cpp)
  echo "build: skipped, running binaries from $bin"
elif { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPILLWAY_CUDA_ARCHS=90a "${prefix_args[@]}" &&
       cmake --build "$build" -j16 --target test_cuda bench_kernels; } >"$out/build.log" 2>&1; then
  echo "build: $(( $(date +%s) - start )) s"
else
  echo "BUILD FAILED after $(( $(date +%s) - start )) s"; grep -E "error|FAILED" "$out/build.log" | head -20
  [ -d .dev/prebuilt ] || exit 1
  bin=.dev/prebuilt
  export SPILLWAY_TEST_BINARY="$(realpath "$bin")/spillway"
  echo "falling back to the binaries in $bin"
fi

if [ "$ws" = 1 ]; then
  # The warp-specialized decode attention (lab SPILLWAY_ATTN_WS, docs/perf-notes.md session 55).
  echo "== ws: tests"
  "$bin/test_cuda" --gtest_filter='CudaAttention.*' >"$out/ws-tests.log" 2>&1
  echo "CudaAttention.* rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/ws-tests.log" | head -2 | tr '\n' ' ')"
  SPILLWAY_ATTN_WS=1 "$bin/test_cuda" --gtest_filter='CudaForward.*:CudaAttention.*:CudaSpill.*' \
    >"$out/ws-tests-knob.log" 2>&1
  echo "CudaForward.*:CudaAttention.*:CudaSpill.* with SPILLWAY_ATTN_WS=1 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/ws-tests-knob.log" | head -2 | tr '\n' ' ')"
  grep -hE "Failure|FAILED  \]|differing|error" "$out/ws-tests.log" "$out/ws-tests-knob.log" | head -20
  echo "== ws: kernel rows (mma and ws4 / ws8)"
  "$bin/bench_kernels" --iters 50 --only " mma" >"$out/ws-bench.log" 2>&1
  echo "bench_kernels rc=$?"
  sed -n '/^device:/p;/^ceilings:/p;/^| kernel/,$p' "$out/ws-bench.log"
  echo "== ws: engine A/B, the single-warp kernel (SPILLWAY_ATTN_WS=0) vs the default (8 streams from 16384 cells)"
  OUT="$out/ab-ws-default" tools/engine-ab.sh --rounds 2 -d 8192,16384,65536 -n 48 -ctk q8_0,q4_0 \
    "$bin/spillway SPILLWAY_ATTN_WS=0" "$bin/spillway" 2>&1 | tail -10
  echo "== ws: engine A/B, SPILLWAY_ATTN_WS=0 vs SPILLWAY_ATTN_WS=1 (4 streams)"
  OUT="$out/ab-ws1" tools/engine-ab.sh --no-warm-up --rounds 1 -d 8192,65536 -n 48 -ctk q8_0,q4_0 \
    "$bin/spillway SPILLWAY_ATTN_WS=0" "$bin/spillway SPILLWAY_ATTN_WS=1" 2>&1 | tail -8
  echo "== ws: engine A/B, SPILLWAY_ATTN_WS=1 vs the same with per-block K (SPILLWAY_ATTN_WS_BLOCK_K=1)"
  OUT="$out/ab-ws1bk" tools/engine-ab.sh --no-warm-up --rounds 1 -d 65536 -n 48 -ctk q8_0,q4_0 \
    "$bin/spillway SPILLWAY_ATTN_WS=1" "$bin/spillway SPILLWAY_ATTN_WS=1 SPILLWAY_ATTN_WS_BLOCK_K=1" 2>&1 | tail -8
  exit 0
fi

test_status="skipped"
if [ -z "$bench_only" ] && [ "$engine_only" = 0 ]; then
  if [ "$bin" = "$build/bin" ] && [ -z "$test_filter" ]; then
    # Four tests at a time on the one GPU: most of a test's time is its host reference
    # (session 37: 72 tests in 84 s as 4 processes, 211 s in one).
    (cd "$build" && ctest -L cuda -j 4 --output-on-failure --timeout 300) >"$out/ctest.log" 2>&1
    test_status=$(grep -E "tests passed|tests failed" "$out/ctest.log" | tail -1)
  else
    shard_pids=()
    for shard in 0 1 2 3; do
      GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$shard "$bin/test_cuda" ${test_filter:+--gtest_filter="$test_filter"} \
        >"$out/ctest-shard$shard.log" 2>&1 &
      shard_pids+=($!)
    done
    shard_rc=0
    for pid in "${shard_pids[@]}"; do wait "$pid" || shard_rc=1; done
    cat "$out"/ctest-shard*.log >"$out/ctest.log"
    test_status="test_cuda (4 shards) rc=$shard_rc: $(grep -c '^\[       OK' "$out/ctest.log") passed, $(grep -c '^\[  FAILED  \] [A-Z]' "$out/ctest.log") failed"
  fi
  grep -E "Failed|FAILED|error|Expected|Which is|seed|SKIPPED" "$out/ctest.log" | head -60
  # The forward suite once more under each lab decode variant that changes the engine's path
  # (session 32): logits against the CPU engine and greedy tokens, as for the default.
  # SPILLWAY_ATTN_MERGE=warp (session 37: the lab's warp merge) runs the attention suite too.
  # SPILLWAY_PREFILL_QKV_ROPE=0 (session 49): the q|k|v GEMM's plain output and the post-QKV
  # launch, the path before the RoPE epilogue; SPILLWAY_WS_ORDER=heads (lab): the prefill
  # attention's grid dealt longest rows first over all heads, with the prefill suites too.
  # SPILLWAY_SHORT_ATTENTION=0 (session 51): qkv_post and the split kernel up to 128 cells, the
  # path before the short-context kernel. SPILLWAY_ATTN_WS=1 (session 55): the warp-specialized
  # decode attention, with the attention and spill suites too; SPILLWAY_ATTN_WS=0 (session 56):
  # the single-warp kernel where the warp-specialized one is now the default.
  knob_reruns="SPILLWAY_HANDOVER=fence SPILLWAY_CHAIN_WO=4 SPILLWAY_QKV_EPILOGUE=1 SPILLWAY_ATTN_MERGE=warp
      SPILLWAY_PREFILL_QKV_ROPE=0 SPILLWAY_WS_ORDER=heads SPILLWAY_SHORT_ATTENTION=0 SPILLWAY_ATTN_WS=1
      SPILLWAY_ATTN_WS=0"
  if [ "$quick" = 1 ]; then knob_reruns=""; echo "quick: the lab-knob reruns skipped"; fi
  for knob in $knob_reruns; do
    suites='CudaForward.*'
    [ "$knob" = SPILLWAY_ATTN_MERGE=warp ] && suites='CudaForward.*:CudaAttention.*'
    [ "$knob" = SPILLWAY_ATTN_WS=1 ] && suites='CudaForward.*:CudaAttention.*:CudaSpill.*'
    [ "$knob" = SPILLWAY_ATTN_WS=0 ] && suites='CudaAttention.*:CudaSpill.*'
    [ "$knob" = SPILLWAY_WS_ORDER=heads ] && suites='CudaForward.*:CudaPrefillAttention.*:CudaPrefill.CausalAttention*'
    env "$knob" "$bin/test_cuda" --gtest_filter="$suites" >"$out/ctest-${knob//=/-}.log" 2>&1
    echo "$suites with $knob rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/ctest-${knob//=/-}.log" | head -2 | tr '\n' ' ')"
  done
  if [ "$sanitize" = 1 ]; then
    compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_cuda" \
      --gtest_filter='CudaAttention.MergedPartials*:CudaSmallOps.*:CudaMatvec.Rejects*' >"$out/sanitize.log" 2>&1
    echo "compute-sanitizer memcheck rc=$? ($(grep -c 'Invalid' "$out/sanitize.log") invalid accesses)"
  fi
fi

bench_args=(--iters 50)
if [ -n "$bench_only" ]; then bench_args+=(--only "$bench_only"); fi
bench_rc=0
if [ "$engine_only" = 0 ] && [ "$quick" = 0 ]; then
  "$bin/bench_kernels" "${bench_args[@]}" >"$out/bench.log" 2>&1
  bench_rc=$?
fi

if [ -n "$ncu_regex" ]; then
  IFS=',' read -ra ncu_pairs <<<"$ncu_regex"
  for pair in "${ncu_pairs[@]}"; do
    ncu --clock-control none --kernel-name "regex:${pair%%@*}" --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
      "$bin/bench_kernels" --iters 5 --only "${pair#*@}" >>"$out/ncu.log" 2>&1
  done
  grep -E "^  [a-z_]+.*kernel|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Duration|Achieved Occupancy|Issued Warp|No Eligible|Stall|Registers Per|Warp Cycles Per Issued" "$out/ncu.log" | head -60
fi

echo
echo "== tests: $test_status"
if [ "$engine_only" = 0 ] && [ "$quick" = 0 ]; then
  echo "== bench rc=$bench_rc"
  sed -n '/^device:/p;/^ceilings:/p;/^| kernel/,$p' "$out/bench.log"
  [ $bench_rc -eq 0 ] || tail -5 "$out/bench.log"
fi

# ---- engine block (appended by the engine engineer; the lines above belong to the kernels) ----
# The CUDA engine's end-to-end bench on the issue-5 shape: Qwen2.5-14B, Q8_0 weights built
# randomly on the GPU, decode at depths 0 / 8k / 64k for f16, q8_0 and q4_0 KV, prefill 512.
# Skipped with --bench-only. Full output in $out/engine-bench.log (and -nograph.log).
if [ -z "$bench_only" ]; then
  if [ ! -x "$bin/spillway" ] && [ "$bin" = "$build/bin" ]; then
    cmake --build "$build" -j16 --target spillway >>"$out/build.log" 2>&1 || echo "engine: spillway build failed"
  fi
  if [ -x "$bin/spillway" ]; then
    echo
    echo "== engine bench (spillway bench --synthetic qwen2.5-14b --wtype q8_0)"
    # A discarded 8k prefill first: the GPU comes up idle, and the first process of a call ran
    # ~10% slow against the same binary later in the call (session 45).
    "$bin/spillway" bench --synthetic qwen2.5-14b --wtype q8_0 -p 8192 -b 2048 -n 0 -ctk f16 >/dev/null 2>&1
    "$bin/spillway" bench --synthetic qwen2.5-14b --wtype q8_0 -p 512 -n 128 -d 0,8192,65536 \
      -ctk f16,q8_0,q4_0 -ctv f16,q8_0,q4_0 >"$out/engine-bench.log" 2>&1
    engine_rc=$?
    echo "engine bench rc=$engine_rc"
    cat "$out/engine-bench.log"
    [ "$quick" = 1 ] && exit "$engine_rc"
    # An 8k prefill with the card's power and SM clock beside it (session 50: the prefill runs at
    # the 700 W cap, ~1.4 of 1.98 GHz on an H100).
    tools/power-trace.sh -- "$bin/spillway" bench --synthetic qwen2.5-14b --wtype q8_0 -p 8192 -b 4096 -n 0 -ctk f16 \
      2>&1 | grep -E "^\| f16|power-trace"
    # The same decode without the per-step graph: what the graph saves in launch gaps.
    "$bin/spillway" bench --synthetic qwen2.5-14b --wtype q8_0 -p 0 -n 64 -d 0 -ctk f16 --no-graph \
      >"$out/engine-bench-nograph.log" 2>&1
    echo "engine bench --no-graph rc=$?"
    grep -E "^\| f16" "$out/engine-bench-nograph.log"
    # Lab A/Bs of measured engine choices (docs/perf-notes.md, session 11): each knob restores
    # the earlier behaviour; run next to the default in the same process image and machine.
    # SPILLWAY_DECODE_LAYER=1 (session 15) turns the lab persistent layer kernel ON (off by default).
    # SPILLWAY_PDL_SMALL=0 (session 16): the small kernels as ordinary launches.
    # SPILLWAY_Q16X_RELEASE=0 / SPILLWAY_ATTN_FINISH=kernels / SPILLWAY_Q16X_KERNEL=smem4
    # / SPILLWAY_POST_QKV=kernel (session 17): GEMVs release at exit; a quantize launch after a
    # single-split attention; the head on the 2-stage variant; bias + RoPE + K/V write in their
    # own launch at every depth. SPILLWAY_GLU_EPILOGUE=0 / SPILLWAY_NORM_CHAIN=0 (session 31):
    # SwiGLU and the RMSNorms as launches of their own between the split-layout GEMVs;
    # Session 32 (lab): SPILLWAY_HANDOVER=fence|skip: the chained epilogues' hand-over with the
    # grid barrier's fences (the default until session 37, now lean: one acq_rel atomic), or
    # none (skip: wrong output, the timing floor); SPILLWAY_CHAIN_WO=4: wo lets gate|up launch when
    # its wait returns (=6: and the split merge before wo is programmatic, which lost with wo
    # releasing at entry); SPILLWAY_QKV_EPILOGUE=1: bias, RoPE and the K / V write in q|k|v's
    # epilogue. Session 51: SPILLWAY_SHORT_ATTENTION=0 (the launches before the short-context
    # kernel, depth 0 only: it takes <= 128 cells). Session 52: SPILLWAY_LAB_SKIP_MERGE=1 (wrong
    # output: the merge hop's bound).
    for knob in default SPILLWAY_SHORT_ATTENTION=0 SPILLWAY_LAB_SKIP_MERGE=1 SPILLWAY_Q16X_SPLIT=pairs SPILLWAY_ATTENTION_QUANT=separate SPILLWAY_DECODE_LAYER=1 SPILLWAY_PDL_SMALL=0 \
        SPILLWAY_Q16X_RELEASE=0 SPILLWAY_ATTN_FINISH=kernels SPILLWAY_Q16X_KERNEL=smem4 SPILLWAY_POST_QKV=kernel \
        SPILLWAY_GLU_EPILOGUE=0 SPILLWAY_NORM_CHAIN=0 SPILLWAY_HANDOVER=fence \
        SPILLWAY_HANDOVER=skip SPILLWAY_CHAIN_WO=4 SPILLWAY_CHAIN_WO=6 SPILLWAY_QKV_EPILOGUE=1; do
      if [ "$knob" = default ]; then knob_env=(); else knob_env=("$knob"); fi
      env "${knob_env[@]}" "$bin/spillway" bench --synthetic qwen2.5-14b --wtype q8_0 -p 0 -n 32 -d 0,8192,65536 \
        -ctk f16 >"$out/engine-ab-${knob//=/-}.log" 2>&1
      echo "engine A/B $knob rc=$?: $(grep -E '^\| f16' "$out/engine-ab-${knob//=/-}.log" | awk -F'|' '{printf "d=%s %s tok/s  ", $5, $6}')"
    done
    # The quantized decode attention's copy fast path (session 13), Q load and split merge
    # (session 19), 64k; splits planned for 6 / 8 blocks per SM, i.e. more than resident, so
    # the hardware deals the rest out as blocks finish (session 39, H100: 8 blocks lost 2-5% at
    # 32k / 64k on every tier; the extra splits cost more than the shorter tail saves).
    # SPILLWAY_ATTN_WS=1 / 2 (session 55): the warp-specialized decode attention, 4 / 8 streams
    # per block.
    for knob in default SPILLWAY_ATTN_WS=1 SPILLWAY_ATTN_WS=2 SPILLWAY_ATTN_FAST_COPY=0 SPILLWAY_ATTN_Q_LOAD=scalar SPILLWAY_ATTN_MERGE=warp \
        SPILLWAY_ATTN_MMA_BLOCKS=6 SPILLWAY_ATTN_MMA_BLOCKS=8; do
      if [ "$knob" = default ]; then knob_env=(); else knob_env=("$knob"); fi
      env "${knob_env[@]}" "$bin/spillway" bench --synthetic qwen2.5-14b --wtype q8_0 -p 0 -n 32 -d 65536 \
        -ctk f16,q8_0,q4_0 -ctv f16,q8_0,q4_0 >"$out/engine-ab-fast-copy-${knob//=/-}.log" 2>&1
      echo "engine A/B $knob rc=$?: $(grep -E '^\| (f16|q)' "$out/engine-ab-fast-copy-${knob//=/-}.log" | awk -F'|' '{printf "%s d=%s %s tok/s  ", $2, $5, $6}')"
    done
    # The quantized decode attention's kernel by range length (sessions 20-21): mma from 2048
    # cells for quantized K with q4_0 V (2 blocks per SM up to 16k cells) and from 6144 with
    # q8_0 V, against mma from 16384 cells with every resident block.
    for knob in default "SPILLWAY_ATTN_MMA_MIN_CELLS=16384 SPILLWAY_ATTN_MMA_BLOCKS=4"; do
      if [ "$knob" = default ]; then knob_env=(); else read -ra knob_env <<<"$knob"; fi
      env "${knob_env[@]}" "$bin/spillway" bench --synthetic qwen2.5-14b --wtype q8_0 -p 0 -n 32 -d 4096,8192,32768 \
        -ctk q8_0,q4_0,q8_0 -ctv q8_0,q4_0,q4_0 >"$out/engine-ab-mma-range.log" 2>&1
      echo "engine A/B $knob rc=$?: $(grep -E '^\| q' "$out/engine-ab-mma-range.log" | awk -F'|' '{printf "%s d=%s %s tok/s  ", $2, $5, $6}')"
    done
    # Q8_0 weights in the split layout at every decode site, the default since session 27
    # (SPILLWAY_Q8_SPLIT=0: GGUF's block layout and the q16x GEMV, 7-13% slower then).
    for knob in default SPILLWAY_Q8_SPLIT=0; do
      if [ "$knob" = default ]; then knob_env=(); else knob_env=("$knob"); fi
      env "${knob_env[@]}" "$bin/spillway" bench --synthetic qwen2.5-14b --wtype q8_0 -p 0 -n 32 -d 0,8192,65536 \
        -ctk f16,q8_0,q4_0 -ctv f16,q8_0,q4_0 >"$out/engine-ab-q8-split.log" 2>&1
      echo "engine A/B $knob rc=$?: $(grep -E '^\| (f16|q)' "$out/engine-ab-q8-split.log" | awk -F'|' '{printf "%s d=%s %s tok/s  ", $2, $5, $6}')"
    done
    # Where the decode attention's time goes inside the engine (lab timeline per layer, session
    # 19; stderr lines): 32k and 64k, every tier.
    SPILLWAY_ATTN_ENGINE_TIMELINE=1 "$bin/spillway" bench --synthetic qwen2.5-14b --wtype q8_0 -p 0 -n 8 \
      -d 32768,65536 -ctk f16,q8_0,q4_0 -ctv f16,q8_0,q4_0 >"$out/engine-attn-timeline.log" 2>&1
    echo "engine attention timeline rc=$?"
    grep -E "attention in the engine|no stamps" "$out/engine-attn-timeline.log"
    # The streamed KV spill (issue 6), short sweep: spilled decode at 8k and 64k against the
    # serial and overlap drop models' predictions (terms measured in the same run). Spills
    # must fit the cache at the depth (q8_0 at 8k holds 816 MiB), hence one run per depth.
    for spill_run in "8192 0,64,512" "65536 0,64,1024"; do
      set -- $spill_run
      "$bin/spillway" bench --synthetic qwen2.5-14b --wtype q8_0 -p 0 -n 16 -d "$1" -ctk f16,q8_0 \
        --spill "$2" >"$out/engine-bench-spill-$1.log" 2>&1
      echo "engine bench -d $1 --spill $2 rc=$?"
      sed -n '/^| ctk | ctv | depth | spill/,$p' "$out/engine-bench-spill-$1.log"
    done
  else
    echo "engine: no spillway binary in $bin"
  fi
fi

# ---- integration block (lead): probes and their cache, plan on this GPU, run --device cuda ----
if [ -z "$bench_only" ] && [ "$engine_only" = 0 ] && [ -x "$bin/spillway" ]; then
  echo
  echo "== probe: first call measures, second loads the cache"
  SPILLWAY_CACHE_DIR=$(mktemp -d)
  export SPILLWAY_CACHE_DIR
  "$bin/spillway" probe >"$out/probe.log" 2>&1
  echo "probe rc=$?"
  cat "$out/probe.log"
  "$bin/spillway" probe --json 2>&1 | grep -E '"from_cache"|"seconds"'
  echo
  echo "== plan on this GPU: qwen2.5-14b shape, ctx 65536, --vram-target 27000, auto-tier on"
  "$bin/spillway" plan --preset qwen2.5-14b -c 65536 --vram-target 27000 --kv-auto-tier 2>&1 | tail -16
  echo
  echo "== run --device cuda vs cpu (tiny preset, greedy, 48 tokens)"
  tiny=$(mktemp --suffix=.gguf)
  "$bin/spillway" make-model --preset tiny --wtype q8_0 --seed 3 -o "$tiny" --no-progress >/dev/null
  for dev in cpu cuda; do
    "$bin/spillway" run -m "$tiny" -p "The quick brown fox jumps" -n 48 --temp 0 \
      --device $dev --json >"$out/run-$dev.json" 2>"$out/run-$dev.err"
    echo "run $dev rc=$? $(python3 -c "import json,sys; d=json.load(open('$out/run-$dev.json')); t=d['timings']; print('prefill %.0f tok/s, decode %.0f tok/s' % (t['prefill_tok_s'], t['decode_tok_s']))" 2>/dev/null)"
  done
  python3 - "$out/run-cpu.json" "$out/run-cuda.json" <<'PY' 2>/dev/null || echo "run comparison failed"
import json, sys
a, b = (json.load(open(p))["generated_tokens"] for p in sys.argv[1:3])
same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
print(f"greedy tokens: cpu {len(a)}, cuda {len(b)}, identical for the first {same}")
PY
  rm -f "$tiny"
  # The spec's four-cell gate: on the trained test model (niah, KL, tok/s; the f16 spill
  # forced by --vram-target) and on the 14B shape with random weights (speed columns).
  echo
  echo "== gate --cells, trained test model, ctx 8192, f16 spill forced (--vram-target 20)"
  "$bin/spillway" gate -m tests/data/trained/niah-llama.gguf --cells --device cuda \
    --tasks single_1,single_2,single_3,multikey_1 --lengths 8192 --depths 3 --vram-target 20 \
    --compute-reserve-mib 0 >"$out/gate-cells.txt" 2>"$out/gate-cells.err"
  echo "gate cells rc=$?"
  sed -n '/^cell /,$p' "$out/gate-cells.txt"
  echo
  echo "== gate --cells --synthetic qwen2.5-14b, ctx 65536, --vram-target 27000"
  "$bin/spillway" gate --synthetic qwen2.5-14b --wtype q8_0 --cells --device cuda -c 65536 \
    --vram-target 27000 >"$out/gate-14b.txt" 2>"$out/gate-14b.err"
  echo "gate 14b rc=$?"
  sed -n '/^cell /,$p' "$out/gate-14b.txt"
fi

# ---- prefill block (P2; only with --hf): prefill kernels in TFLOP/s (bench_prefill), then
# spillway's prefill against HF transformers' bf16 SDPA prefill on the Qwen2.5-14B shape, 8k and
# 64k tokens, in this same run (tools/hf-prefill-bench.py prints the ratio). Logs in $out.
if [ "$hf" = 1 ]; then
  if [ "$bin" = "$build/bin" ]; then
    cmake --build "$build" -j16 --target bench_prefill spillway >>"$out/build.log" 2>&1 || echo "prefill: build failed"
  fi
  echo
  echo "== prefill kernels (bench_prefill)"
  "$bin/bench_prefill" >"$out/bench-prefill.log" 2>&1
  echo "bench_prefill rc=$?"
  cat "$out/bench-prefill.log"
  echo
  echo "== prefill vs HF transformers (tools/hf-prefill-bench.py)"
  PYTHONUNBUFFERED=1 python3 tools/hf-prefill-bench.py --spillway "$bin/spillway" >"$out/hf-prefill.log" 2>&1
  echo "hf-prefill-bench rc=$?"
  cat "$out/hf-prefill.log"
  # Lab A/Bs of the prefill choices (docs/perf-notes.md, session 12), 8k tokens, -b 2048,
  # then where an 8k prefill's GPU time goes (SPILLWAY_OP_TIMES=1; ms over warm-up + timed run).
  echo
  echo "== prefill A/B, 8k tokens -b 2048 (tok/s)"
  # The default runs first and again last: the GPU's clocks settle over the first runs (session
  # 45), so compare a knob with both default rows.
  for knob in default SPILLWAY_PREFILL_WGMMA=0 SPILLWAY_WGMMA_SCHEDULE=skew128 SPILLWAY_ATTN_F16_OUT=0 SPILLWAY_PREFILL_FUSED=0 SPILLWAY_ROPE_TABLE=0 \
              SPILLWAY_PREFILL_GEMM=cublas SPILLWAY_PREFILL_GEMM_MERGE=0 SPILLWAY_PREFILL_GLU=0 SPILLWAY_GEMM_STREAM_K=0 \
              SPILLWAY_PREFILL_OVERLAP=0 SPILLWAY_PREFILL_TILES=greedy SPILLWAY_QKV_POST=block SPILLWAY_RMSNORM_MANY_ROWS=0 default; do
    if [ "$knob" = default ]; then knob_env=(); else knob_env=("$knob"); fi
    env "${knob_env[@]}" "$bin/spillway" bench --synthetic qwen2.5-14b --wtype q8_0 -p 8192 -n 0 -b 2048 -ctk f16 \
      >"$out/prefill-ab.log" 2>&1
    echo "prefill A/B $knob rc=$?: $(grep -E '^\| f16 \| f16 \| pp' "$out/prefill-ab.log" | awk -F'|' '{print $6}') tok/s"
  done
  # 512-token prompts: the codes GEMM against cuBLAS on tiles, and without its stream-K tail (session 44).
  for knob in default SPILLWAY_PREFILL_GEMM=cublas SPILLWAY_GEMM_STREAM_K=0; do
    if [ "$knob" = default ]; then knob_env=(); else knob_env=("$knob"); fi
    env "${knob_env[@]}" "$bin/spillway" bench --synthetic qwen2.5-14b --wtype q8_0 -p 512 -n 0 -r 2 -ctk f16 \
      >"$out/prefill-ab.log" 2>&1
    echo "prefill A/B pp512 $knob rc=$?: $(grep -E '^\| f16 \| f16 \| pp' "$out/prefill-ab.log" | awk -F'|' '{print $6}') tok/s"
  done
  # A quantized cache's prefill: dequantized f16 pieces vs the kernels on the raw cells (session 14).
  for knob in default SPILLWAY_PREFILL_KV_F16=0; do
    if [ "$knob" = default ]; then knob_env=(); else knob_env=("$knob"); fi
    env "${knob_env[@]}" "$bin/spillway" bench --synthetic qwen2.5-14b --wtype q8_0 -p 8192 -n 0 -b 2048 -ctk q8_0 \
      >"$out/prefill-ab.log" 2>&1
    echo "prefill A/B q8_0 KV $knob rc=$?: $(grep -E '^\| q8_0 \| q8_0 \| pp' "$out/prefill-ab.log" | awk -F'|' '{print $6}') tok/s"
  done
  SPILLWAY_OP_TIMES=1 "$bin/spillway" bench --synthetic qwen2.5-14b --wtype q8_0 -p 8192 -n 0 -b 2048 -ctk f16 \
    >/dev/null 2>"$out/prefill-op-times.log"
  sed -n '/^op times/,$p' "$out/prefill-op-times.log"
fi
