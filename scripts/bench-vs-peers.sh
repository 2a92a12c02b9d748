#!/usr/bin/env bash
# One command, one table: hcsflow and its peers (numpy/scipy/scikit-image from ../shared/bench),
# interleaved on identical inputs, ratios measured in the same session.
#
#   scripts/bench-vs-peers.sh                 # every op of bench/suite.json
#   scripts/bench-vs-peers.sh zproj,gaussian  # ops whose peer name contains one of these
#
# WORK (default /tmp/hcsflow-peerbench) holds the peer venv, the cached inputs and the results.
# PEER_BENCH (default ../shared/bench next to the repository) holds the peer scripts.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${WORK:-/tmp/hcsflow-peerbench}"
PEER_BENCH="${PEER_BENCH:-$REPO/../shared/bench}"
export PEERBENCH_DATA="${PEERBENCH_DATA:-$WORK/data}"
mkdir -p "$WORK/results" "$PEERBENCH_DATA"
[ -f "$PEER_BENCH/common.py" ] || { echo "error: peer scripts not found in $PEER_BENCH (set PEER_BENCH)" >&2; exit 2; }

# The peers' environment, created on first use (same packages as ../shared/bench/run_all.sh).
V="$WORK/venv-main"
if [ ! -x "$V/bin/python" ]; then
  python3 -m venv "$V"
  "$V/bin/pip" install -q --upgrade pip
  "$V/bin/pip" install -q numpy scipy scikit-image tifffile psutil
fi

cargo build --release -p hcsflow-cli --manifest-path "$REPO/Cargo.toml"
BIN="${CARGO_TARGET_DIR:-$REPO/target}/release/hcsflow"

ONLY=()
[ $# -gt 0 ] && ONLY=(--only "$1")
"$V/bin/python" -W ignore "$REPO/scripts/bench_peers.py" --peer-dir "$PEER_BENCH" --hcsflow "$BIN" \
  --suite "$REPO/bench/suite.json" --work "$WORK/results" "${ONLY[@]}" | tee "$WORK/results/bench-vs-peers.log"
