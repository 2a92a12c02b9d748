"""Side-by-side benchmark driver: the peers from ../shared/bench and hcsflow, interleaved,
on identical inputs (the peer's cached .npy files, verified by SHA-256 on both sides).

Run through scripts/bench-vs-peers.sh, which creates the peer virtualenv and builds hcsflow.
Prints one Markdown table (and writes JSON): operation, peer, peer median, our median,
ratio (peer / ours: > 1 means hcsflow is faster), CPU medians, peak RSS, accuracy.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

import numpy as np


def sha256(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def reference(peer_dir, script, op, out_path):
    """Run the peer op once (its own code) and save its output for the accuracy column."""
    sys.path.insert(0, peer_dir)
    mod = __import__(os.path.splitext(script)[0])
    import common
    f, _repeats, needs = mod.OPS[op]
    data = common.z_stack() if needs == "stack" else common.cells_image()
    out = f(data)()
    if isinstance(out, np.ndarray):
        np.save(out_path, out)
        print(json.dumps({"saved": out_path, "shape": list(out.shape), "dtype": str(out.dtype)}))
    else:
        print(json.dumps({"saved": None, "type": type(out).__name__}))


def last_json(text):
    lines = [l for l in text.splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def accuracy(ours_path, peer_path):
    ours = np.load(ours_path).astype(np.float64)
    peer = np.load(peer_path).astype(np.float64)
    ours = ours.reshape(ours.shape[-2:]) if ours.shape[0] == 1 and peer.ndim == 2 else ours
    if ours.shape != peer.shape:
        return f"shapes differ: {ours.shape} vs {peer.shape}"
    d = np.abs(ours - peer)
    scale = max(np.abs(peer).max(), 1e-12)
    return f"max abs Δ {d.max():.3g} ({d.max() / scale:.1e} rel)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer-dir", required=True)
    ap.add_argument("--hcsflow", required=True, help="path to the hcsflow binary")
    ap.add_argument("--suite", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--only", help="comma-separated substrings of peer ops")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--reference", nargs=3, metavar=("SCRIPT", "OP", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.reference:
        return reference(a.peer_dir, *a.reference)

    sys.path.insert(0, a.peer_dir)
    import common  # the peer's own input generator (cached .npy under $PEERBENCH_DATA)

    suite = json.load(open(a.suite))["ops"]
    if a.only:
        suite = [o for o in suite if any(s in o["peer_op"] for s in a.only.split(","))]
    # Inputs are generated once by the peer's code; we pass the same files to hcsflow.
    common.cells_image()
    common.z_stack()
    inputs = {
        "image": os.path.join(common.DATA, "cells_2048x2048_s0.npy"),
        "stack": os.path.join(common.DATA, "zstack_30x2048x2048_s0.npy"),
    }
    sums = {k: sha256(np.load(p)) for k, p in inputs.items()}
    registered = {f["name"] for f in json.loads(subprocess.run([a.hcsflow, "functions", "--json"], capture_output=True, text=True, check=True).stdout)}
    os.makedirs(a.work, exist_ok=True)
    rows = []
    for o in suite:
        row = {"op": o["peer_op"], "function": o["function"]}
        # Peer timing: its own script, its own process.
        p = subprocess.run([sys.executable, "-W", "ignore", os.path.join(a.peer_dir, o["peer_script"]), "--op", o["peer_op"]],
                           capture_output=True, text=True)
        row["peer"] = last_json(p.stdout) or {"error": p.stderr[-400:]}
        if o["function"] not in registered:
            row["ours"] = {"error": "not implemented"}
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        ref = os.path.join(a.work, o["peer_op"] + ".peer.npy")
        r = subprocess.run([sys.executable, "-W", "ignore", __file__, "--peer-dir", a.peer_dir, "--hcsflow", a.hcsflow,
                            "--suite", a.suite, "--work", a.work, "--reference", o["peer_script"], o["peer_op"], ref],
                           capture_output=True, text=True)
        saved = (last_json(r.stdout) or {}).get("saved")
        ours_out = os.path.join(a.work, o["peer_op"] + ".ours.npy")
        cmd = [a.hcsflow, "bench", "op", o["function"], "--input", inputs[o["input"]], "--dtype", o.get("dtype", "input"),
               "--repeats", str(a.repeats), "--save-output", ours_out, "--label", o["peer_op"]]
        for arg in o.get("args", []):
            cmd += ["--arg", arg]
        q = subprocess.run(cmd, capture_output=True, text=True)
        row["ours"] = last_json(q.stdout) or {"error": q.stderr[-400:]}
        if "input_sha256" in row["ours"]:
            row["identical_input"] = row["ours"]["input_sha256"] == sums[o["input"]]
        if saved and os.path.exists(ours_out):
            row["accuracy"] = accuracy(ours_out, saved)
        if o.get("note"):
            row["accuracy"] = f"{row.get('accuracy', 'n/a')}; {o['note']}"
        rows.append(row)
        print(json.dumps(row), flush=True)

    meta = {"versions": common.versions("numpy", "scipy", "skimage"), "input_sha256": sums, "loadavg": os.getloadavg()}
    with open(os.path.join(a.work, "bench-vs-peers.json"), "w") as fh:
        json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    print()
    print("| operation | peer | peer median s | hcsflow median s | ratio (peer/ours) | peer CPU s | ours CPU s | peer RSS MiB | ours RSS MiB | identical input | accuracy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        pe, ou = r["peer"], r["ours"]
        if "error" in ou or "error" in pe:
            print(f"| {r['op']} | {o_peer(r)} | {pe.get('median_s', '–')} | {ou.get('error', pe.get('error', ''))[:60]} | | | | | | | |")
            continue
        ratio = pe["median_s"] / ou["median_s"] if ou["median_s"] > 0 else float("inf")
        print(f"| {r['op']} | {o_peer(r)} | {pe['median_s']:.4f} | {ou['median_s']:.4f} | {ratio:.1f}× | {pe.get('cpu_median_s', float('nan')):.4f} | "
              f"{ou['cpu_median_s']:.4f} | {pe.get('peak_rss_mib', float('nan')):.0f} | {ou['peak_rss_mib']:.0f} | "
              f"{'yes' if r.get('identical_input') else 'NO'} | {r.get('accuracy', 'n/a')} |")
    print(f"\ninputs (sha256): {json.dumps(sums)}; load average {os.getloadavg()}")


def o_peer(r):
    """The peer library named in the op (the peer scripts name ops after what they call)."""
    for lib in ("skimage", "scipy", "numpy", "openhcs"):
        if lib in r["op"]:
            return lib
    return "numpy"


if __name__ == "__main__":
    main()
