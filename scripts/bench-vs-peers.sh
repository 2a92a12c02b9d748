#!/usr/bin/env bash
# One command, one table: hcsflow and its peers (../shared/bench: numpy/scipy/scikit-image, ASHLAR,
# OpenHCS; BaSiCPy and CAREamics with PEERS_HEAVY=1), interleaved on identical inputs, ratios
# measured in the same session. What runs is listed in bench/suite.json.
#
#   scripts/bench-vs-peers.sh                      # everything (≈ 30–60 min on a 2-core machine)
#   scripts/bench-vs-peers.sh zproj,gaussian       # rows whose name contains one of these
#   scripts/bench-vs-peers.sh stitch               # the ASHLAR tile grids only
#   scripts/bench-vs-peers.sh pipeline             # the end-to-end pipeline against OpenHCS only
#   OPENHCS_TORCH_FROM=/path/to/site-packages scripts/bench-vs-peers.sh mega_flex
#                                                  # examples/mega_flex.toml against OpenHCS running the same steps
#                                                  # (its N2V2 needs torch: linked from a venv that has it)
#   PEERS_HEAVY=1 scripts/bench-vs-peers.sh basicpy  # BaSiC fit, fit with dark-field, correction against BaSiCPy
#   PEERS_HEAVY=1 scripts/bench-vs-peers.sh n2v      # N2V2 against CAREamics: s/step, predict 1024²/2048², PSNR, RSS
#
# WORK (default /tmp/hcsflow-peerbench) holds one virtualenv per peer (created on first use, from
# PyPI), the cached inputs ($WORK/data) and the results ($WORK/results/bench-vs-peers.{md,json}).
# PEER_BENCH (default ../shared/bench next to the repository) holds the peer scripts.
# REPEATS (default 11) is the number of timed runs of our side per op: on a shared 2-core machine
# our multi-threaded runs scatter far more than the peers' single-threaded ones (the watershed's
# from 15 to 52 ms in one process), and the median of 5 moved by a fifth between runs.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${WORK:-/tmp/hcsflow-peerbench}"
PEER_BENCH="${PEER_BENCH:-$REPO/../shared/bench}"
export PEERBENCH_DATA="${PEERBENCH_DATA:-$WORK/data}"
mkdir -p "$WORK/results" "$PEERBENCH_DATA"
[ -f "$PEER_BENCH/common.py" ] || { echo "error: peer scripts not found in $PEER_BENCH (set PEER_BENCH)" >&2; exit 2; }

# The main peer environment (numpy/scipy/scikit-image), which also runs the driver; the driver
# creates the other peers' environments on first use. Packages: bench/suite.json "venvs".
V="$WORK/venv-main"
if [ ! -x "$V/bin/python" ]; then
  python3 -m venv "$V"
  "$V/bin/pip" install -q --upgrade pip
  # shellcheck disable=SC2046
  "$V/bin/pip" install -q $(python3 -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))["venvs"]["main"]))' "$REPO/bench/suite.json")
fi

cargo build --release -p hcsflow-cli --manifest-path "$REPO/Cargo.toml"
# A private copy: a build in a shared target folder cannot swap the binary during the run.
mkdir -p "$WORK/bin"
BIN="$WORK/bin/hcsflow"
cp "${CARGO_TARGET_DIR:-$REPO/target}/release/hcsflow" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
# N2V2 against CAREamics (PEERS_HEAVY=1): hcsflow-n2v's bench_n2v example is our side.
N2V=()
if [ "${PEERS_HEAVY:-}" = 1 ]; then
  cargo build --release -p hcsflow-n2v --example bench_n2v --manifest-path "$REPO/Cargo.toml"
  cp "${CARGO_TARGET_DIR:-$REPO/target}/release/examples/bench_n2v" "$WORK/bin/bench_n2v.tmp" && mv "$WORK/bin/bench_n2v.tmp" "$WORK/bin/bench_n2v"
  N2V=(--n2v-bin "$WORK/bin/bench_n2v")
fi

ONLY=()
[ $# -gt 0 ] && ONLY=(--only "$1")
"$V/bin/python" -W ignore "$REPO/scripts/bench_peers.py" --peer-dir "$PEER_BENCH" --hcsflow "$BIN" \
  --suite "$REPO/bench/suite.json" --work "$WORK/results" --venvs "$WORK" --repeats "${REPEATS:-11}" "${ONLY[@]}" "${N2V[@]}" \
  | tee "$WORK/results/bench-vs-peers.log"
