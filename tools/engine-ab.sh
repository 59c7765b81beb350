#!/usr/bin/env bash
# Interleaved decode A/B of the engine, on the GPU machine. Each side is a spillway binary and
# optional NAME=VALUE environment (lab knobs); rounds run A, B, A, B, ... so a drift of the
# card's speed hits both sides; the table gives each side's tok/s per round and B / A of the
# means per KV tier and depth.
#   tools/engine-ab.sh [--rounds N] [-d LIST] [-n N] [-ctk LIST] [-ctv LIST] SIDE_A SIDE_B
#   SIDE: "BIN [NAME=VALUE ...]" as one argument
# e.g. old binary against new (e.g. built from another commit and carried):
#   tools/engine-ab.sh -d 16384,32768,65536 .dev/old/spillway build-lead/bin/spillway
# a lab knob on one binary:
#   tools/engine-ab.sh build-lead/bin/spillway "build-lead/bin/spillway SPILLWAY_ATTN_MMA_BLOCKS=8"
# Why a tool: every A/B in docs/perf-notes.md had both sides in one call, interleaved (machines
# differ by a few % at the same code), and each session rewrote this loop in an untracked script.
# Logs land in $OUT (or ./out) as ab-{a,b}-ROUND.log.
set -uo pipefail
rounds=2
depths=8192,65536
n_gen=32
ctk=f16,q8_0,q4_0
ctv=""
sides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    -d) depths="$2"; shift 2 ;;
    -n) n_gen="$2"; shift 2 ;;
    -ctk) ctk="$2"; shift 2 ;;
    -ctv) ctv="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "engine-ab: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) sides+=("$1"); shift ;;
  esac
done
if [ ${#sides[@]} -ne 2 ]; then
  echo "engine-ab: give two sides, e.g. OLD_BIN \"NEW_BIN SPILLWAY_KNOB=1\" (see --help)" >&2
  exit 2
fi
[ -n "$ctv" ] || ctv=$ctk
case "$rounds" in ''|*[!0-9]*|0) echo "engine-ab: --rounds must be a positive integer" >&2; exit 2 ;; esac
for side in "${sides[@]}"; do
  read -ra words <<<"$side"
  [ -x "${words[0]}" ] || { echo "engine-ab: ${words[0]} is not an executable" >&2; exit 2; }
  for w in "${words[@]:1}"; do
    [[ "$w" == *=* ]] || { echo "engine-ab: '$w' in \"$side\" is not NAME=VALUE" >&2; exit 2; }
  done
done
out=${OUT:-out}
mkdir -p "$out"

status=0
for ((r = 1; r <= rounds; ++r)); do
  for i in 0 1; do
    label=$([ $i -eq 0 ] && echo a || echo b)
    read -ra words <<<"${sides[$i]}"
    log="$out/ab-$label-$r.log"
    env "${words[@]:1}" "${words[0]}" bench --synthetic qwen2.5-14b --wtype q8_0 -p 0 -n "$n_gen" -d "$depths" \
      -ctk "$ctk" -ctv "$ctv" >"$log" 2>&1
    rc=$?
    echo "round $r side $label rc=$rc ($SECONDS s)"
    [ $rc -eq 0 ] || { status=1; tail -3 "$log"; }
  done
done

# The bench's markdown rows: | ctk | ctv | test | depth | tok/s | ...
python3 - "$out" "$rounds" "${sides[0]}" "${sides[1]}" <<'EOF'
import sys
out, rounds, side_a, side_b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = {}  # (ctk/ctv, depth) -> {"a": [...], "b": [...]}
order = []
devices = []  # the bench's "device: NAME, HBM read N GB/s" line of every run
for r in range(1, rounds + 1):
    for label in "ab":
        try:
            lines = open(f"{out}/ab-{label}-{r}.log").read().splitlines()
        except OSError:
            continue
        devices += [l for l in lines if l.startswith("device:")]
        for line in lines:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 5 or not cells[2].startswith("tg"):
                continue
            try:
                tok_s = float(cells[4].split()[0])  # "mean" or "mean ± sd" (-r)
            except ValueError:
                continue
            key = (f"{cells[0]}/{cells[1]}", cells[3])
            if key not in rows:
                rows[key] = {"a": [], "b": []}
                order.append(key)
            rows[key][label].append(tok_s)
print(f"\nA = {side_a}\nB = {side_b}")
for d in dict.fromkeys(devices):
    print(d)
print()
print("| KV | depth | A tok/s by round | B tok/s by round | B / A |")
print("|---|---:|---|---|---:|")
for key in order:
    a, b = rows[key]["a"], rows[key]["b"]
    ratio = f"{(sum(b) / len(b)) / (sum(a) / len(a)):.4f}" if a and b else "-"
    fmt = lambda v: " / ".join(f"{x:.1f}" for x in v) or "-"
    print(f"| {key[0]} | {key[1]} | {fmt(a)} | {fmt(b)} | {ratio} |")
EOF
exit $status
