#!/usr/bin/env bash
# Registers and spills of every kernel instance in one CUDA source, from ptxas, without a GPU:
#   tools/kernel-regs.sh BUILD_DIR SOURCE [GREP_PATTERN]
# e.g. tools/kernel-regs.sh build-lead engine/cuda/attention_mma.cu attention_mma_kernel
# Recompiles SOURCE with the build's own command plus -Xptxas -v into a temporary object (the
# build's object is left alone) and prints one line per entry: registers, spill stores / loads
# (bytes), stack frame, demangled name. Why: in the decode attention (128 registers at 4 blocks
# per SM) a change's speed followed its spills more than its instruction count (perf-notes,
# session 22), so look at this before spending device time.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: tools/kernel-regs.sh BUILD_DIR SOURCE [GREP_PATTERN]" >&2
  exit 2
fi
build=$1
src=$2
pattern=${3:-.}
[ -f "$build/build.ninja" ] || { echo "kernel-regs: $build has no build.ninja (configure with Ninja first)" >&2; exit 1; }
obj=$(ninja -C "$build" -t targets all 2>/dev/null | grep -F "/$src.o:" | head -1 | cut -d: -f1 || true)
[ -n "$obj" ] || { echo "kernel-regs: no object for $src in $build" >&2; exit 1; }
cmd=$(ninja -C "$build" -t commands "$obj" | tail -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The build's output path replaced by the temporary one; ptxas reports on stderr.
cmd=${cmd//-o $obj/-o $tmp/out.o}
(cd "$build" && eval "$cmd -Xptxas -v") >"$tmp/log" 2>&1 || { tail -20 "$tmp/log" >&2; exit 1; }
# Portable awk (Debian's default mawk has no match() captures).
awk '
  /Compiling entry function/ { name = $0; sub(/.*function ./, "", name); sub(/. for .*/, "", name) }
  /bytes stack frame/ { stack = $1; stores = $5; loads = $9 }
  /Used [0-9]+ registers/ && name != "" {
    regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
    printf "%4d regs  %4d / %4d spill  %4d stack  %s\n", regs, stores, loads, stack, name
    name = ""
  }' "$tmp/log" | c++filt | grep -E -- "$pattern" || { echo "kernel-regs: no entry matches $pattern" >&2; exit 1; }
