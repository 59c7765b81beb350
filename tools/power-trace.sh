#!/usr/bin/env bash
# Runs a command while nvidia-smi samples the GPU's power draw, SM clock and throttle reasons,
# then prints one summary line of the samples taken while the card was busy (drawing more than
# a quarter of its power limit). Why: the 14B prefill runs at the H100's 700 W cap with the SM
# clock at ~1.4 of 1.98 GHz (perf-notes, session 50), so a prefill kernel's speed follows its
# energy per flop; an A/B should say what clock each side ran at.
#
#   tools/power-trace.sh [-i MS] [-o FILE] -- COMMAND [ARGS...]
#
# -i: sampling interval in ms (default 100); -o: keep the raw samples (CSV) in FILE.
# The command's own output and exit status pass through; the summary goes to stderr.
set -u
interval=100
raw=""
while [ $# -gt 0 ]; do
  case "$1" in
    -i) interval="${2:?-i needs a value}"; shift 2 ;;
    -o) raw="${2:?-o needs a file}"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "power-trace: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "power-trace: give a command after --" >&2; exit 2; }
case "$interval" in ''|*[!0-9]*) echo "power-trace: -i wants a whole number of ms" >&2; exit 2 ;; esac
[ "$interval" -ge 20 ] || { echo "power-trace: -i below 20 ms is more than nvidia-smi keeps up with" >&2; exit 2; }

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "power-trace: no nvidia-smi here; running the command without a trace" >&2
  "$@"
  exit $?
fi

samples=$(mktemp)
trap 'rm -f "$samples"' EXIT
limit=$(nvidia-smi --query-gpu=power.limit --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
nvidia-smi --query-gpu=power.draw,clocks.sm,clocks_throttle_reasons.active --format=csv,noheader,nounits \
  -i 0 -lms "$interval" >"$samples" 2>/dev/null &
sampler=$!
"$@"
status=$?
kill "$sampler" 2>/dev/null
wait "$sampler" 2>/dev/null
[ -n "$raw" ] && cp "$samples" "$raw"

# Throttle bit 0x4 is the software power cap (nvidia-smi -q's "SW Power Cap").
awk -F', *' -v limit="${limit:-0}" '
  function hex(s,   i, c, v) { v = 0; s = tolower(s); sub(/^0x/, "", s)
    for (i = 1; i <= length(s); i++) { c = index("0123456789abcdef", substr(s, i, 1)) - 1; v = v * 16 + c } return v }
  $1 + 0 > 0.25 * limit {
    n++; p += $1; c += $2
    if (n == 1 || $2 < cmin) cmin = $2
    if ($2 > cmax) cmax = $2
    if (int(hex($3) / 4) % 2 == 1) capped++
  }
  END {
    if (n == 0) { printf "power-trace: no busy samples (limit %s W)\n", limit; exit }
    printf "power-trace: %d busy samples: %.0f W mean of %s W, SM clock %.0f MHz mean (%d-%d), power-capped in %.0f%%\n",
           n, p / n, limit, c / n, cmin, cmax, 100 * capped / n
  }' "$samples" >&2
exit $status
