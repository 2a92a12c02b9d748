#!/usr/bin/env bash
# The GPU memory budget at real size (#22): one 30 × 2048² u16 stack (240 MiB) through a blur and a
# max projection on the first GPU adapter (lavapipe here) with a 64 MiB budget, against the same
# pipeline on the host. Exits non-zero unless the GPU run split the stack, its output is
# byte-identical to the host's, and the run report says how it split. The test
# crates/hcsflow/tests/it/gpu_memory.rs checks the same at 30 × 64² with a 64 KiB budget on every CI run;
# this script is the full-size run (about 35 s and 1.6 GiB on lavapipe, 260 MB of scratch disk).
#
#   scripts/gpu-memory-real-size.sh   # WORK: scratch folder (default: a temporary one, deleted after
#                                     # unless KEEP=1); HCSFLOW_BIN: a built CLI instead of building one
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${HCSFLOW_BIN:-}" ]; then
  cargo build --release -q -p hcsflow-cli --manifest-path "$REPO/Cargo.toml"
fi
BIN="${HCSFLOW_BIN:-${CARGO_TARGET_DIR:-$REPO/target}/release/hcsflow}"
WORK="${WORK:-$(mktemp -d)}"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

"$BIN" synth plate --wells A01 --grid 1x1 --channels 1 --z 30 --size 2048 --overwrite
cat > blur_max.toml <<'EOF'
[[steps]]
name = "z"
func = ["gaussian_blur", "max_projection"]
variable_components = ["z_index"]
materialize = ["tiff"]
EOF
"$BIN" run plate blur_max.toml cpu --device cpu
"$BIN" run plate blur_max.toml gpu --device gpu --allow-software-gpu --gpu-memory 64M

out=z/TimePoint_1/Synth_Plate_1_A01.tif
cmp "cpu/$out" "gpu/$out"
echo "identical: the 64 MiB GPU run and the host run wrote the same $out"
python3 - gpu/run_report.json <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
splits = [s for w in report["wells"] for step in w["steps"] for s in step.get("splits", [])]
if report.get("gpu_memory") != 64 << 20 or not splits:
    sys.exit(f"error: the run report shows no split under a 64 MiB budget: {report.get('gpu_memory')}, {splits}")
for s in splits:
    print(f"split: {', '.join(s['functions'])}: {s['planes']} planes in {s['chunks']} chunks of {s['chunk_planes']} ({s['reason']})")
EOF
