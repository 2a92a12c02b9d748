#!/usr/bin/env bash
# A Python step's cost in hcsflow, and a plate run with one numpy step against OpenHCS running the
# same numpy function on the same plate (OpenHCS's synthetic ImageXpress plate), interleaved, ratios
# from the same run. See scripts/bench_python_step.py.
#
#   scripts/bench-python-step.sh            # TILE=1024 GRID=3 REPEATS=3 by default
#
# WORK (default /tmp/hcsflow-peerbench) holds the OpenHCS virtualenv (venv-openhcs, shared with
# scripts/bench-vs-peers.sh, created on first use from PyPI) and the result
# ($WORK/results/python-step.json). hcsflow runs from the test venv ($CARGO_TARGET_DIR/oracle-venv),
# with the package built in release mode into it.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${WORK:-/tmp/hcsflow-peerbench}"
mkdir -p "$WORK/results"
VENV="${HCSFLOW_VENV:-${CARGO_TARGET_DIR:-$REPO/target}/oracle-venv}"
if [ ! -x "$VENV/bin/python3" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/python3" -m pip install --quiet -r "$REPO/.ci/requirements-oracles.txt"
fi
"$VENV/bin/python3" -m pip install --quiet maturin
"$VENV/bin/python3" -m pip install --quiet --force-reinstall --no-deps "$REPO/crates/hcsflow-python"
OH="$WORK/venv-openhcs"
if [ ! -x "$OH/bin/python" ]; then
  python3 -m venv "$OH"
  "$OH/bin/pip" install -q openhcs psutil
fi
"$VENV/bin/python3" "$REPO/scripts/bench_python_step.py" compare --hcsflow-python "$VENV/bin/python3" \
  --openhcs-python "$OH/bin/python" --tile "${TILE:-1024}" --grid "${GRID:-3}" --repeats "${REPEATS:-3}" \
  --work "$WORK" | tee "$WORK/results/python-step.json"
