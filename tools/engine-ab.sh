#!/usr/bin/env bash
# Interleaved A/B of the engine, on the GPU machine. Each side is a spillway binary and
# optional NAME=VALUE environment (lab knobs). A discarded 8k prefill first (the GPU comes up
# idle: the first process of a call ran ~10% slow against the same binary later, session 45),
# then rounds in ABBA order (A B, B A, A B, ...) so that a drift of the card's speed hits both
# sides; the table gives each side's tok/s per round and B / A of the means per KV tier and test.
#   tools/engine-ab.sh [--rounds N] [-d LIST] [-n N] [-ctk LIST] [-ctv LIST] [--prefill LIST]
#                      [--no-warm-up] SIDE_A SIDE_B
#   SIDE: "BIN [NAME=VALUE ...]" as one argument
#   --prefill LIST: prefill instead of decode, prompts of N tokens in chunks of B for each N[:B]
#     in LIST (e.g. 8192:2048,512; -ctk's first tier; -r 2 for prompts up to 2048 tokens)
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
prefill=""
warm_up=1
sides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    -d) depths="$2"; shift 2 ;;
    -n) n_gen="$2"; shift 2 ;;
    -ctk) ctk="$2"; shift 2 ;;
    -ctv) ctv="$2"; shift 2 ;;
    --prefill) prefill="$2"; shift 2 ;;
    --no-warm-up) warm_up=0; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
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

# One side's bench run into a log: decode at the depths, or each prefill of --prefill.
run_side() {
  local log=$1
  shift
  local words=("$@")
  if [ -z "$prefill" ]; then
    env "${words[@]:1}" "${words[0]}" bench --synthetic qwen2.5-14b --wtype q8_0 -p 0 -n "$n_gen" -d "$depths" \
      -ctk "$ctk" -ctv "$ctv" >"$log" 2>&1
    return
  fi
  : >"$log"
  local item n b reps rc=0
  IFS=',' read -ra items <<<"$prefill"
  for item in "${items[@]}"; do
    n=${item%%:*}
    b=$([[ "$item" == *:* ]] && echo "${item#*:}" || echo 512)
    reps=$([ "$n" -le 2048 ] && echo 2 || echo 1)
    env "${words[@]:1}" "${words[0]}" bench --synthetic qwen2.5-14b --wtype q8_0 -p "$n" -n 0 -b "$b" -r "$reps" \
      -ctk "${ctk%%,*}" >>"$log" 2>&1 || rc=$?
  done
  return $rc
}

status=0
if [ "$warm_up" = 1 ]; then
  read -ra words <<<"${sides[0]}"
  "${words[0]}" bench --synthetic qwen2.5-14b --wtype q8_0 -p 8192 -n 0 -b 2048 -ctk f16 >/dev/null 2>&1
  echo "warm-up done ($SECONDS s)"
fi
for ((r = 1; r <= rounds; ++r)); do
  order=$([ $((r % 2)) -eq 1 ] && echo "0 1" || echo "1 0")
  for i in $order; do
    label=$([ $i -eq 0 ] && echo a || echo b)
    read -ra words <<<"${sides[$i]}"
    log="$out/ab-$label-$r.log"
    run_side "$log" "${words[@]}"
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
envs = {"a": [], "b": []}  # its "env: ..." line (the SPILLWAY_* settings): the knob reached the side
for r in range(1, rounds + 1):
    for label in "ab":
        try:
            lines = open(f"{out}/ab-{label}-{r}.log").read().splitlines()
        except OSError:
            continue
        devices += [l for l in lines if l.startswith("device:")]
        envs[label] += [l for l in lines if l.startswith("env:")]
        for line in lines:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 5 or not (cells[2].startswith("tg") or cells[2].startswith("pp")):
                continue
            try:
                tok_s = float(cells[4].split()[0])  # "mean" or "mean ± sd" (-r)
            except ValueError:
                continue
            key = (f"{cells[0]}/{cells[1]}", f"{cells[2]} @ {cells[3]}")
            if key not in rows:
                rows[key] = {"a": [], "b": []}
                order.append(key)
            rows[key][label].append(tok_s)
print(f"\nA = {side_a}\nB = {side_b}")
for d in dict.fromkeys(devices):
    print(d)
for label in "ab":
    for e in dict.fromkeys(envs[label]):
        print(f"{label.upper()} {e}")
print()
print("| KV | test @ depth | A tok/s by round | B tok/s by round | B / A |")
print("|---|---:|---|---|---:|")
for key in order:
    a, b = rows[key]["a"], rows[key]["b"]
    ratio = f"{(sum(b) / len(b)) / (sum(a) / len(a)):.4f}" if a and b else "-"
    fmt = lambda v: " / ".join(f"{x:.1f}" for x in v) or "-"
    print(f"| {key[0]} | {key[1]} | {fmt(a)} | {fmt(b)} | {ratio} |")
EOF
exit $status
