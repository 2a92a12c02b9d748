#!/usr/bin/env bash
# The one-box benchmark of issue 21: a 384-well ImageXpress plate of 2048² images (9 sites,
# 2 channels, 3 z planes: 20,736 planes, 174 GB of u16 pixels) run by `hcsflow run` within
# `--max-memory`; prints, per budget, the peak RSS (/usr/bin/time and the run's own report),
# the wall time and the input MB/s, and whether the peak stayed under the budget.
#
#   scripts/bench-384.sh                         # budgets 4G and 1G, 2 workers (≈ 40 min per budget on 2 loaded cores)
#   BUDGETS="4G 2G 1G" WORKERS=2 scripts/bench-384.sh
#   WELLS=24 scripts/bench-384.sh                # a quick try on the first 24 wells of the plate
#
# The plate is not 174 GB on disk. `hcsflow synth` writes SOURCE_WELLS (default 4) wells of the
# 384-well layout at full size (1.8 GB on disk); every other well's files are hard links to one of them
# under the file names MetaXpress writes (`Synth_Plate_1_C05_s3_w2.tif`), and the HTD marks all
# 384 wells acquired, so the plate parser, the compiler and the executor see 384 wells of 54
# planes each. Inputs repeat: after the first wells the page cache serves every read, so MB/s
# is of the processing (decode, compute, writes), not of the disk.
#
# The pipeline (written into WORK, below) is the demo's, with outputs that fit a small disk:
# normalise → channel composite → max-Z → tile positions → an 8× binned preview of each
# composite tile (TIFF); the original channels re-read → max-Z → mosaic (assemble at those
# positions) → image quality → nuclei count on channel 1. Written: the preview TIFFs and the
# tables (positions, edges, image quality, counts, objects): 0.9 GB for the 384 wells. Each
# run's output folder is removed after it is measured; WORK is removed at the end (KEEP=1 keeps
# it). Disk: 1.8 GB for the plate and the outputs of one run at a time.
#
# HCSFLOW=path/to/hcsflow uses that binary instead of building the release one.
# WORK (default $CARGO_TARGET_DIR/bench-384) holds the plate, a private copy of the binary and
# the results (removed with it; the summary is printed).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
WORK="${WORK:-$TARGET/bench-384}"
BUDGETS="${BUDGETS:-4G 1G}"
WORKERS="${WORKERS:-2}"
SIZE="${SIZE:-2048}"
CHANNELS="${CHANNELS:-2}"
Z="${Z:-3}"
SOURCE_WELLS="${SOURCE_WELLS:-4}"
WELLS="${WELLS:-384}"
KEEP="${KEEP:-0}"

[ -x /usr/bin/time ] || { echo "error: /usr/bin/time (GNU time) is needed for the peak RSS" >&2; exit 2; }
case "$WORK" in /|"") echo "error: WORK=$WORK" >&2; exit 2 ;; esac

cleanup() {
  if [ "$KEEP" = 1 ]; then
    echo "kept: $WORK"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

if [ -z "${HCSFLOW:-}" ]; then
  cargo build --release -p hcsflow-cli --manifest-path "$REPO/Cargo.toml"
  HCSFLOW="$TARGET/release/hcsflow"
fi
rm -rf "$WORK"
mkdir -p "$WORK/bin"
# A private copy: a build in a shared target folder cannot swap the binary during the run.
BIN="$WORK/bin/hcsflow"
cp "$HCSFLOW" "$BIN"

# --- The plate -------------------------------------------------------------------------------
ROWS=(A B C D E F G H I J K L M N O P)
ALL=()
for r in "${ROWS[@]}"; do
  for c in $(seq -w 1 24); do ALL+=("$r$c"); done
done
ALL=("${ALL[@]:0:$WELLS}")
SRC=("${ALL[@]:0:$SOURCE_WELLS}")
PLATE="$WORK/plate"
"$BIN" synth "$PLATE" --plate 384 --wells "$(IFS=,; echo "${SRC[*]}")" --size "$SIZE" \
  --channels "$CHANNELS" --z "$Z" --grid 3x3 --seed 0 >/dev/null
# Every well of the benchmark acquired (the HTD lists the plate's 16 rows × 24 columns).
HTD=("$PLATE"/*.HTD)
LC_ALL=C awk -v n="$WELLS" '
  /^"WellsSelection[0-9]+"/ {
    row = substr($1, 16) + 0
    line = "\"WellsSelection" row "\""
    for (c = 1; c <= 24; c++) line = line ", " (((row - 1) * 24 + c <= n) ? "TRUE" : "FALSE")
    printf "%s\r\n", line; next
  }
  { print }' "${HTD[0]}" >"$WORK/htd.tmp"
mv "$WORK/htd.tmp" "${HTD[0]}"
# Hard links: well i gets the files of source well i mod SOURCE_WELLS, under its own names.
for k in "${!SRC[@]}"; do
  s="${SRC[$k]}"
  mapfile -t files < <(find "$PLATE" -name "*_${s}_s*.tif")
  for ((i = k + SOURCE_WELLS; i < ${#ALL[@]}; i += SOURCE_WELLS)); do
    w="${ALL[$i]}"
    for f in "${files[@]}"; do
      n="${f##*/}"
      ln "$f" "${f%/*}/${n/_${s}_/_${w}_}"
    done
  done
done
PLANES=$(find "$PLATE" -name '*.tif' -path '*TimePoint*' | wc -l)
"$BIN" inspect "$PLATE" | grep -E '^(Plate size|Wells|Sites|Channels|Z planes|Image|Images|Missing):'
echo "plate: $WELLS wells, $PLANES planes of ${SIZE}² u16 ($(du -sh "$PLATE" | cut -f1) on disk, hard links)"

# --- The pipeline ----------------------------------------------------------------------------
PIPE="$WORK/bench-384.toml"
cat >"$PIPE" <<'EOF'
name = "bench_384"
description = "normalise → composite → max-Z → positions → binned preview; channels re-read → max-Z → assemble → image quality → nuclei count"

[[steps]]
name = "normalise"
func = { name = "stack_percentile_normalize", args = { low_percentile = 1.0, high_percentile = 99.0 } }
variable_components = ["site", "z_index"]

[[steps]]
name = "composite"
func = "composite"
variable_components = ["channel"]
group_by = "none"

[[steps]]
name = "max_z"
func = "max_projection"
variable_components = ["z_index"]

[[steps]]
name = "positions"
func = "tile_positions"
variable_components = ["site"]
group_by = "none"
device = "cpu"

[[steps]]
name = "preview"
func = { name = "bin", args = { factor = 8 } }
variable_components = ["site"]
group_by = "none"
dtype = "u16"
stretch = true
materialize = ["tiff"]

[[steps]]
name = "channels_max_z"
func = "max_projection"
variable_components = ["z_index"]
input_source = "pipeline_start"

[[steps]]
name = "mosaic"
func = { name = "assemble", args = { blend = "linear" } }
variable_components = ["site"]
artifacts_from = { positions = "positions" }

[[steps]]
name = "quality"
func = "image_quality"
variable_components = ["site"]

[[steps]]
name = "count"
variable_components = ["site"]
missing_groups = "skip"
device = "cpu"
[steps.func]
1 = { name = "count_cells", args = { method = "threshold", min_area = 40, max_area = 2000 } }
EOF

# --- The runs --------------------------------------------------------------------------------
to_bytes() { numfmt --from=iec "$1"; }
RESULTS="$WORK/results.txt"
: >"$RESULTS"
for budget in $BUDGETS; do
  out="$WORK/out-$budget"
  load0="$(cut -d' ' -f1-3 /proc/loadavg)"
  start="$(date -u +%H:%M:%S)"
  set +e
  /usr/bin/time -v -o "$WORK/time-$budget.txt" "$BIN" run "$PLATE" "$PIPE" "$out" --device cpu \
    --workers "$WORKERS" --max-memory "$budget" --report "$WORK/report-$budget.json" 2>"$WORK/run-$budget.log"
  rc=$?
  set -e
  load1="$(cut -d' ' -f1-3 /proc/loadavg)"
  tail -n 3 "$WORK/run-$budget.log" | grep -v '^note' || true
  written="$(du -sh "$out" 2>/dev/null | cut -f1)"
  rm -rf "$out"
  rss_kib="$(awk -F': ' '/Maximum resident set size/ {print $2}' "$WORK/time-$budget.txt")"
  wall="$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$WORK/time-$budget.txt")"
  cpu="$(awk -F': ' '/User time/ {u=$2} /System time/ {s=$2} END {printf "%.0f", u + s}' "$WORK/time-$budget.txt")"
  python3 - "$WORK/report-$budget.json" "$budget" "$(to_bytes "$budget")" "$rss_kib" "$wall" "$cpu" \
    "$WORKERS" "$rc" "$load0" "$load1" "$start" "$written" <<'EOF' | tee -a "$RESULTS"
import json, sys
path, budget, budget_b, rss_kib, wall, cpu, workers, rc, load0, load1, start, written = sys.argv[1:]
r = json.load(open(path))
ok = sum(1 for w in r["wells"] if w["status"] == "complete")
h, m, s = ([0, 0] + [float(x) for x in wall.split(":")])[-3:]
wall_s = h * 3600 + m * 60 + s
peak_time = int(rss_kib) * 1024
peak_report = r["peak_rss_bytes"]
budget_b = int(budget_b)
print(f"budget {budget}: exit {rc}, {ok} of {len(r['wells'])} wells complete, {r['workers']} workers, "
      f"start {start} UTC, load average {load0} -> {load1}")
print(f"  peak RSS {peak_time / 2**20:.0f} MiB (/usr/bin/time), {peak_report / 2**20:.0f} MiB (run_report.json) "
      f"of a budget of {budget_b / 2**20:.0f} MiB: "
      f"{peak_time / budget_b:.0%} of the budget, {'under' if peak_time <= budget_b else 'OVER'} it")
print(f"  wall {wall_s:.0f} s (process), CPU {cpu} s; input {r['input_bytes'] / 1e9:.1f} GB: "
      f"{r['input_bytes'] / 1e6 / wall_s:.0f} MB/s of wall time, {r['mb_per_s']:.0f} MB/s by the report "
      f"({r['seconds']:.0f} s of execution); written {written}")
EOF
done
echo
echo "== summary ($(nproc) CPUs, $(free -g | awk '/Mem:/ {print $2}') GiB RAM; checkout $(git -C "$REPO" describe --always --dirty 2>/dev/null || echo '?'), binary sha256 $(sha256sum "$BIN" | cut -c1-12)) =="
cat "$RESULTS"
