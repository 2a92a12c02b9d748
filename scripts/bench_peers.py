"""Side-by-side benchmark driver: the peers from ../shared/bench and hcsflow, interleaved,
on identical inputs, in one session (on a shared machine only ratios from one run mean anything).

Run through scripts/bench-vs-peers.sh, which creates the main peer virtualenv and builds hcsflow;
this driver creates the other peers' virtualenvs on first use (bench/suite.json lists them).

Five sections, one table (Markdown on stdout and in WORK/bench-vs-peers.md, JSON in
WORK/bench-vs-peers.json):
- ops: numpy/scipy/scikit-image ops of bench_skimage.py (and BaSiCPy/CAREamics with
  PEERS_HEAVY=1) against `hcsflow bench op` on the peer's own cached .npy input; accuracy is
  our output against the peer's output. Ops whose function we lack are listed as not implemented.
- stitch: bench_ashlar.py's tile grids (ASHLAR reads them as TIFFs) against `hcsflow bench stitch`
  on the same TIFFs; accuracy is the position error against the grid's ground truth, with
  bench_ashlar.py's own formula (per axis, relative to tile 0) applied to our positions.
- pipeline: bench_openhcs.py (OpenHCS's own synthetic ImageXpress plate and demo pipeline) and
  `hcsflow run` with our demo pipeline on the same image files, MB/s and peak RSS.
- mega_flex: examples/mega_flex.toml and OpenHCS running the same steps (bench/peers/
  bench_openhcs_mega_flex.py) on one `hcsflow synth` plate: end to end without N2V2 (both measured), N2V2
  alone and end to end with it (OpenHCS's N2V2 refuses CPU: its own code without that guard, timed on one
  plane and extrapolated; set OPENHCS_TORCH_FROM to a site-packages with torch, see torch_for_openhcs).
- n2v (PEERS_HEAVY=1): bench_n2v.py (CAREamics N2V2) and hcsflow-n2v's bench_n2v example trained on
  the same noisy pair with the same steps, patch and batch: s/step, prediction 1024² and 2048²,
  PSNR after training, peak RSS.

Each row carries the input SHA-256 as each side saw it, median/min/max wall time, CPU time and
peak RSS of both sides.
"""
import argparse
import glob
import hashlib
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np


def sha256(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def last_json(text):
    lines = [l for l in text.splitlines() if l.startswith("{")]
    try:
        return json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timing(d):
    """The timing fields both sides report (median/min/max wall, CPU, peak RSS)."""
    keys = ("median_s", "min_s", "max_s", "runs", "cpu_median_s", "peak_rss_mib")
    return {k: d.get(k) for k in keys} if d else None


class Venvs:
    """One virtualenv per peer under WORK (as ../shared/bench/run_all.sh does), created on first use."""

    def __init__(self, root, spec, heavy, allow_heavy):
        self.root, self.spec, self.heavy, self.allow_heavy = root, spec, set(heavy), allow_heavy

    def available(self, name):
        return name not in self.heavy or self.allow_heavy

    def python(self, name):
        if name == "main":
            return sys.executable  # the driver runs in the main venv
        v = os.path.join(self.root, f"venv-{name}")
        py = os.path.join(v, "bin", "python")
        if not os.path.exists(py):
            print(f"creating the {name} peer venv in {v} (first use)", file=sys.stderr, flush=True)
            subprocess.run(["python3", "-m", "venv", v], check=True)
            subprocess.run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
            subprocess.run([py, "-m", "pip", "install", "-q", *self.spec[name]], check=True)
        return py


def package_versions(py, packages):
    """The installed versions of `packages` in the interpreter `py` (absent ones left out)."""
    code = ("import importlib.metadata as m, json, sys\nv = {}\nfor p in sys.argv[1:]:\n"
            "    try: v[p] = m.version(p)\n    except m.PackageNotFoundError: pass\nprint(json.dumps(v))")
    p = subprocess.run([py, "-c", code, *packages], capture_output=True, text=True)
    return last_json(p.stdout) or {"error": p.stderr[-200:]}


# Peer scripts of this repository (bench/peers/), for peer ops ../shared/bench lacks: a suite op with
# "peer_local": true runs bench/peers/<peer_script>, which imports the shared bench's common.py.
LOCAL_PEERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "peers")


def script_path(peer_dir, script):
    """A peer script: ../shared/bench's, else this repository's bench/peers/ one."""
    shared = os.path.join(peer_dir, script)
    return shared if os.path.exists(shared) else os.path.join(LOCAL_PEERS, script)


def run_peer(py, peer_dir, script, op, env=None, extra=()):
    """One peer op in its own interpreter; returns (its JSON line or an error, process CPU s)."""
    c0 = children_cpu()
    env = dict(env if env is not None else os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (peer_dir, env.get("PYTHONPATH")) if p)
    p = subprocess.run([py, "-W", "ignore", script_path(peer_dir, script), *(["--op", op] if op else []), *extra],
                       capture_output=True, text=True, env=env)
    cpu = children_cpu() - c0
    res = last_json(p.stdout)
    if p.returncode != 0 or res is None:
        return {"error": (p.stderr or p.stdout)[-400:].strip() or f"exit {p.returncode}"}, cpu
    return res, cpu


# ---------------------------------------------------------------- ops
def reference(peer_dir, script, op, out_path):
    """Run the peer op once (its own code) and save its output for the accuracy column."""
    sys.path.insert(0, peer_dir)
    sys.path.insert(1, LOCAL_PEERS)
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


def accuracy(ours_path, peer_path):
    ours, peer = np.load(ours_path), np.load(peer_path)
    # A float result in [0, 1] (skimage's convention) against our u16: compare on the u16 scale.
    scaled = ours.dtype == np.uint16 and peer.dtype.kind == "f" and peer.size and 0 <= peer.min() and peer.max() <= 1
    ours = ours.astype(np.float64)
    peer = peer.astype(np.float64) * (65535.0 if scaled else 1.0)
    ours = ours.reshape(ours.shape[-2:]) if ours.shape[0] == 1 and peer.ndim == 2 else ours
    if ours.shape != peer.shape:
        return f"shapes differ: {ours.shape} vs {peer.shape}"
    d = np.abs(ours - peer)
    scale = max(np.abs(peer).max(), 1e-12)
    return f"max abs Δ {d.max():.3g} ({d.max() / scale:.1e} rel){' on the u16 scale (peer × 65535)' if scaled else ''}"


# ---------------------------------------------------------------- BaSiC
def basic_tiles(common):
    """The tiles bench_basicpy.py fits (its cached basic_<N>x1024.npz, made here if absent, from the same
    seeds), saved as .npy for `hcsflow bench op`; returns (path, tiles, true flat-field)."""
    import bench_basicpy  # numpy only at import; its generator needs no torch
    imgs, flat = bench_basicpy.synth_fields()
    path = os.path.join(common.DATA, f"basic_{imgs.shape[0]}x{imgs.shape[1]}.npy")
    if not os.path.exists(path):
        np.save(path + ".tmp.npy", imgs)
        os.replace(path + ".tmp.npy", path)
    return path, imgs, flat


def basic_profiles(a, tiles):
    """Profile TIFFs (flat-field, dark-field) from our own basic_fit of the BaSiC tiles, made once per run."""
    import tifffile
    ffp, dfp = (os.path.join(a.work, f"basic_{k}.tif") for k in ("flatfield", "darkfield"))
    if not (os.path.exists(ffp) and os.path.exists(dfp)):
        out = os.path.join(a.work, "basic_profiles.npy")
        subprocess.run([a.hcsflow, "bench", "op", "basic_fit", "--input", tiles, "--dtype", "f32", "--repeats", "1",
                        "--warmup", "0", "--save-output", out], capture_output=True, text=True, check=True)
        planes = np.load(out)
        tifffile.imwrite(ffp, planes[0].astype(np.float32))
        tifffile.imwrite(dfp, planes[1].astype(np.float32))
        os.remove(out)
    return {"basic_flatfield": ffp, "basic_darkfield": dfp}


def basic_flat_accuracy(ours_path, peer_result, true_flat):
    """Each side's flat-field against the true one, with bench_basicpy.py's metric (RMS and max of the
    difference of the mean-1 profiles); the peer's numbers are those its own run printed."""
    import bench_basicpy
    rms, mx = bench_basicpy._flat_err(np.load(ours_path)[0], true_flat)
    m = re.search(r"flat_rms_err=([0-9.]+) flat_max_err=([0-9.]+)", (peer_result or {}).get("note", ""))
    peer = f"BaSiCPy rms {float(m.group(1)):.4f} / max {float(m.group(2)):.4f}, " if m else ""
    return f"flat-field vs truth: {peer}hcsflow rms {rms:.4f} / max {mx:.4f}"


# ---------------------------------------------------------------- Richardson–Lucy
def rl_inputs(common, peer_dir, work):
    """What bench_skimage.py's RL ops deconvolve, as files for our side: its 30×512² crop of the z-stack as
    f32 divided by its maximum (.npy), and its 15³ Gaussian PSF (TIFF)."""
    sys.path.insert(0, peer_dir)
    import bench_skimage
    import tifffile
    sub = common.z_stack()[:, 768:1280, 768:1280].astype(np.float32)
    sub /= sub.max()
    path, psf = os.path.join(work, "rl_30x512x512.npy"), os.path.join(work, "rl_psf_15x15x15.tif")
    np.save(path, sub)
    tifffile.imwrite(psf, bench_skimage._gauss_psf())
    return path, sha256(sub), psf


def object_inputs(common, work, wanted):
    """The derived inputs of bench/peers/bench_objects.py's ops as .npy files for our side, made by its
    own helpers from the cached cells image: nuclei_mask (u8), watershed ([−EDT, markers, mask] f32),
    labels_image ([labels, image] u16), coloc_image ([A, B] u16); returns ({name: path}, {name: SHA-256})."""
    sys.path.insert(1, LOCAL_PEERS)
    import bench_objects
    img = common.cells_image()
    makers = {
        "nuclei_mask": lambda: bench_objects.nuclei_mask(img).astype(np.uint8)[None],
        "watershed": lambda: np.stack([a.astype(np.float32) for a in bench_objects.watershed_inputs(img)]),
        "labels_image": lambda: np.stack([bench_objects.nuclei_labels(img).astype(np.uint16), img]),
        "coloc_image": lambda: np.stack(bench_objects.coloc_channels(img)),
    }
    paths, sums = {}, {}
    for name in wanted & set(makers):
        arr = makers[name]()
        paths[name] = os.path.join(work, f"objects_{name}.npy")
        np.save(paths[name], arr)
        sums[name] = sha256(arr)
    return paths, sums


def peer_library(script, op):
    """The peer library an op measures (the peer scripts name ops after what they call)."""
    by_script = {"bench_basicpy.py": "BaSiCPy", "bench_n2v.py": "CAREamics", "bench_ashlar.py": "ASHLAR",
                 "bench_openhcs.py": "OpenHCS"}
    if script in by_script:
        return by_script[script]
    for lib in ("skimage", "scipy", "numpy", "openhcs"):
        if lib in op:
            return {"openhcs": "OpenHCS-style numpy"}.get(lib, lib)
    return "numpy"


def run_ops(a, suite, venvs, registered, common, rows):
    ops = [o for o in suite["ops"]
           if selected(a, o["peer_op"]) or selected(a, f"{peer_library(o['peer_script'], o['peer_op'])} {o['peer_op']}")]
    if not ops:
        return
    wanted = {o.get("input", "image") for o in ops}
    inputs, sums = {}, {}
    if wanted & {"image", "stack"}:
        common.cells_image()
        common.z_stack()
        inputs["image"] = os.path.join(common.DATA, "cells_2048x2048_s0.npy")
        inputs["stack"] = os.path.join(common.DATA, "zstack_30x2048x2048_s0.npy")
        sums = {k: sha256(np.load(p)) for k, p in inputs.items()}
    if "rl_stack" in wanted:
        inputs["rl_stack"], sums["rl_stack"], inputs["rl_psf"] = rl_inputs(common, a.peer_dir, a.work)
    if wanted & {"nuclei_mask", "watershed", "labels_image", "coloc_image"}:
        p, s = object_inputs(common, a.work, wanted)
        inputs.update(p)
        sums.update(s)
    true_flat = None
    if "basic" in wanted:
        # The peer loads these same tiles from bench_basicpy.py's cache: its input checksum is theirs.
        inputs["basic"], tiles, true_flat = basic_tiles(common)
        sums["basic"] = sha256(tiles)
        del tiles
    for o in ops:
        venv = o.get("venv", "main")
        lib = peer_library(o["peer_script"], o["peer_op"])
        label = o["peer_op"] if o["peer_script"] in ("bench_skimage.py", "bench_objects.py") else f"{lib} {o['peer_op']}"
        row = {"section": "ops", "op": label, "peer": lib, "peer_op": o["peer_op"],
               "function": o["function"], "notes": o.get("note", "")}
        implemented = o["function"] in registered
        if not implemented:
            row["ours"] = {"error": f"not implemented (no function `{o['function']}`)"}
            row["notes"] = o.get("what", "")
        if venvs.available(venv):
            if venv != "main" and venv not in rows.meta.setdefault("peer_versions", {}):
                rows.meta["peer_versions"][venv] = package_versions(venvs.python(venv), suite["venvs"][venv] + ["torch"])
            res, _ = run_peer(venvs.python(venv), a.peer_dir, o["peer_script"], o["peer_op"])
            row["peer_result"] = res
            if "error" not in res and res.get("median_s") is not None:
                row["peer_time"] = timing(res)
                if venv == "main" or o.get("input") == "basic":
                    row["input_sha256_peer"] = sums[o.get("input", "image")]
            else:
                row["peer_error"] = res.get("error", "no timing")
        else:
            row["peer_error"] = f"not run (its venv `{venv}` needs torch; PEERS_HEAVY=1 runs it)"
        if implemented:
            run_our_op(a, o, inputs, row, true_flat)
        rows.add(row)


def run_our_op(a, o, inputs, row, true_flat=None):
    ref = os.path.join(a.work, o["peer_op"] + ".peer.npy")
    kind = o.get("accuracy", "outputs")
    saved = None
    if kind == "outputs":  # the peer's output, for the accuracy column
        r = subprocess.run([sys.executable, "-W", "ignore", __file__, "--peer-dir", a.peer_dir, "--hcsflow", a.hcsflow,
                            "--suite", a.suite, "--work", a.work, "--reference", o["peer_script"], o["peer_op"], ref],
                           capture_output=True, text=True)
        saved = (last_json(r.stdout) or {}).get("saved")
    ours_out = os.path.join(a.work, o["peer_op"] + ".ours.npy")
    cmd = [a.hcsflow, "bench", "op", o["function"], "--input", inputs[o["input"]], "--dtype", o.get("dtype", "input"),
           "--repeats", str(a.repeats), "--save-output", ours_out, "--label", o["peer_op"]]
    args = [arg.replace("{rl_psf}", inputs.get("rl_psf", "")) for arg in o.get("args", [])]
    if any("{basic_" in arg for arg in args):
        try:
            paths = basic_profiles(a, inputs["basic"])
        except subprocess.CalledProcessError as e:
            row["ours"] = {"error": f"basic_fit for the profiles failed: {e.stderr[-300:].strip()}"}
            return
        args = [arg.format(**paths) for arg in args]
    for arg in args:
        cmd += ["--arg", arg]
    q = subprocess.run(cmd, capture_output=True, text=True)
    res = last_json(q.stdout)
    if q.returncode != 0 or res is None:
        row["ours"] = {"error": q.stderr[-400:].strip()}
        return
    row["ours"] = res
    row["ours_time"] = timing(res)
    row["input_sha256_ours"] = res["input_sha256"]
    if saved and os.path.exists(ours_out):
        row["accuracy"] = accuracy(ours_out, saved)
    elif kind == "basic_flat" and os.path.exists(ours_out) and true_flat is not None:
        row["accuracy"] = basic_flat_accuracy(ours_out, row.get("peer_result"), true_flat)
    elif kind == "none":
        row["accuracy"] = "– (timing only)"
    for p in (ref, ours_out):  # up to 250 MB each: keep the results folder small
        if os.path.exists(p):
            os.remove(p)


# ---------------------------------------------------------------- stitch
def position_error(pos_yx, true_yx):
    """bench_ashlar.py's error: |(pos − pos₀) − (true − true₀)| per axis, px; (max, mean)."""
    pos, true = np.asarray(pos_yx, float), np.asarray(true_yx, float)
    err = np.abs((pos - pos[0]) - (true - true[0]))
    return float(err.max()), float(err.mean())


def ashlar_error(note):
    """ASHLAR's error as bench_ashlar.py computed it from ASHLAR's positions (its `note`)."""
    m = re.search(r"max_err_px=([0-9.]+) mean_err_px=([0-9.]+)", note or "")
    return (float(m.group(1)), float(m.group(2))) if m else None


def run_stitch(a, suite, venvs, rows):
    cfgs = [c for c in suite["stitch"] if selected(a, "stitch " + c["name"])]
    if not cfgs:
        return
    sys.path.insert(0, a.peer_dir)
    import bench_ashlar  # its grid generator and TIFF writer (tifffile is in the main venv)
    import tifffile
    py = venvs.python("ashlar")
    v = subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version('ashlar'))"], capture_output=True, text=True)
    rows.meta["ashlar_version"] = v.stdout.strip()
    for c in cfgs:
        name = c["name"]
        d, cfg, _nominal, true = bench_ashlar.write_tiles(name)
        n = cfg["rows"] * cfg["cols"]
        tiles = np.stack([tifffile.imread(os.path.join(d, f"img_{i:03d}.tif")) for i in range(n)])
        peer_sum = sha256(tiles)  # what ASHLAR reads
        del tiles
        label = f"{cfg['rows']}×{cfg['cols']} × {c['tile']}²"
        peer = {}
        for kind in ("align", "align_noperm"):
            peer[kind], _ = run_peer(py, a.peer_dir, "bench_ashlar.py", f"{kind}:{name}")
        cmd = [a.hcsflow, "bench", "stitch", d, "--rows", str(cfg["rows"]), "--cols", str(cfg["cols"]),
               "--overlap", str(c["overlap"]), "--repeats", str(a.repeats), "--label", f"stitch_{name}"]
        q = subprocess.run(cmd, capture_output=True, text=True)
        ours = last_json(q.stdout) if q.returncode == 0 else None
        if ours is None:
            ours = {"error": q.stderr[-400:].strip()}
        peer["assemble"], _ = run_peer(py, a.peer_dir, "bench_ashlar.py", f"assemble:{name}")
        ours_err = position_error(ours["positions_yx"], true) if "positions_yx" in ours else None
        for kind, what in (("align", f"tile positions {label} (ASHLAR default: permutation test)"),
                           ("align_noperm", f"tile positions {label} (ASHLAR max_error=inf)"),
                           ("assemble", f"mosaic assembly {label}, blended")):
            p = peer[kind]
            row = {"section": "stitch", "op": what, "peer": "ASHLAR", "peer_op": f"{kind}:{name}", "peer_result": p,
                   "ours": {k: v for k, v in ours.items() if k != "positions_yx"}, "input_sha256_peer": peer_sum}
            if "error" in p:
                row["peer_error"] = p["error"]
            else:
                row["peer_time"] = timing(p)
            if "error" not in ours:
                t = ours["assemble" if kind == "assemble" else "positions"]
                row["ours_time"] = timing(t)
                row["input_sha256_ours"] = ours["input_sha256"]
                inner = ours["assemble_in_memory" if kind == "assemble" else "positions_in_memory"]["median_s"]
                row["notes"] = f"ours incl. reading the TIFFs as the peer does; {inner:.3f} s with tiles in memory"
            if kind == "assemble":
                shape = ours.get("mosaic_shape")
                row["accuracy"] = "–"
                if shape:
                    row["notes"] += f"; mosaic {shape[0]}×{shape[1]} ({shape[0] * shape[1] / 1e6:.1f} MPix), {ours['blend']} blend; peer {p.get('note', '')}"
            else:
                pe = ashlar_error(p.get("note"))
                parts = []
                if pe:
                    parts.append(f"ASHLAR max {pe[0]:.2f} / mean {pe[1]:.2f} px")
                if ours_err:
                    parts.append(f"hcsflow max {ours_err[0]:.3f} / mean {ours_err[1]:.3f} px")
                row["accuracy"] = "; ".join(parts) or "n/a"
                if "edges" in ours:
                    row["notes"] += f"; {ours['edges_accepted']}/{ours['edges']} edges accepted"
            rows.add(row)


# ---------------------------------------------------------------- n2v
def run_n2v(a, suite, venvs, rows):
    """N2V2 self-supervised denoising: bench_n2v.py (CAREamics) and hcsflow-n2v's bench_n2v example
    on the same pair (bench_n2v.noisy_pair(): 1024² synthetic nuclei, Poisson + read noise, seed 7),
    the same steps, patch 64 and batch 16, each trained from scratch in its own process, one run
    each. Three rows: training time per step (with both PSNRs after those steps as accuracy),
    prediction of the 1024² image and of its 2 × 2 tiling (2048²); peak RSS is each process's."""
    cases = [c for c in suite.get("n2v", []) if selected(a, "n2v " + c["name"])]
    if not cases:
        return
    sys.path.insert(0, a.peer_dir)
    import bench_n2v  # numpy only at import: its pair generator and PSNR
    for c in cases:
        steps, epochs = c["steps_per_epoch"], c["epochs"]
        total = steps * epochs
        what = (f"N2V2 training step (patch 64 × batch {c['batch']}, {total} steps)",
                "N2V2 prediction 1024² (overlap 48; tiles: CAREamics 256, ours ≤ 512)",
                "N2V2 prediction 2048² (overlap 48; tiles: CAREamics 256, ours ≤ 512)")
        base = [{"section": "n2v", "op": w, "peer": "CAREamics", "peer_op": c["peer_op"]} for w in what]
        # CAREamics' epoch over an array is its 64² patches, (1024 / 64)² = 256, so 16 batches of
        # 16: `num_steps` above that is cut to it (Lightning's limit_train_batches), and the peer's
        # s/step (wall time / (epochs × num_steps)) would count steps it never took.
        epoch_batches = (1024 // 64) ** 2 // c["batch"]
        if steps > epoch_batches:
            for row in base:
                row["peer_error"] = (f"steps_per_epoch {steps} > the {epoch_batches} batches of CAREamics' epoch: it "
                                     f"would take {epoch_batches * epochs} steps, not {total}")
                row["ours"] = {"error": "not run: the sides would not take the same steps"}
                rows.add(row)
            continue
        if not venvs.available(c["venv"]) or not a.n2v_bin:
            for row in base:
                row["peer_error"] = f"not run (its venv `{c['venv']}` needs torch; PEERS_HEAVY=1 runs it)"
                row["ours"] = {"error": "not run without the peer (PEERS_HEAVY=1)"}
                rows.add(row)
            continue
        clean, noisy = bench_n2v.noisy_pair()
        pair_sum = sha256(noisy)
        d = os.path.join(a.work, "n2v_pair")
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, "n2v_clean.npy"), clean.astype(np.float32))
        np.save(os.path.join(d, "n2v_noisy.npy"), noisy.astype(np.float32))
        py = venvs.python(c["venv"])
        rows.meta.setdefault("peer_versions", {})[c["venv"]] = package_versions(py, suite["venvs"][c["venv"]] + ["torch"])
        env = dict(os.environ, N2V_STEPS=str(steps), N2V_EPOCHS=str(epochs))
        load_peer = os.getloadavg()[0]
        peer, peer_cpu = run_peer(py, a.peer_dir, "bench_n2v.py", c["peer_op"], env=env)
        load_ours = os.getloadavg()[0]
        c0 = children_cpu()
        q = subprocess.run([a.n2v_bin, d, "--steps", str(steps), "--epochs", str(epochs), "--batch", str(c["batch"])],
                           capture_output=True, text=True)
        ours_cpu = children_cpu() - c0
        ours = last_json(q.stdout) if q.returncode == 0 else None
        if ours is None:
            ours = {"error": (q.stderr or q.stdout)[-400:].strip() or f"exit {q.returncode}"}
        shutil.rmtree(d, ignore_errors=True)
        m = re.search(r"noisy=([0-9.]+) dB -> denoised=([0-9.]+) dB", peer.get("note", ""))
        peer_psnr = f"CAREamics {float(m.group(1)):.2f} → {float(m.group(2)):.2f} dB" if m else "CAREamics –"
        ours_psnr = (f"hcsflow {ours['psnr_noisy_db']:.2f} → {ours['psnr_denoised_db']:.2f} dB"
                     if "psnr_denoised_db" in ours else "hcsflow –")
        keys = ("s_per_step", "predict_1024_s", "predict_2048_s")
        for row, key in zip(base, keys):
            row.update(peer_result=peer, ours=ours, input_sha256_peer=pair_sum, input_sha256_ours=pair_sum)
            for side, res, cpu in (("peer", peer, peer_cpu), ("ours", ours, ours_cpu)):
                if "error" in res or res.get(key) is None:
                    if side == "peer":
                        row["peer_error"] = res.get("error", f"no {key}")
                    continue
                row[f"{side}_time"] = {"median_s": res[key], "min_s": res[key], "max_s": res[key], "runs": 1,
                                       "cpu_median_s": None, "peak_rss_mib": res.get("peak_rss_mib")}
            row["accuracy"] = f"PSNR vs clean after {total} steps: {peer_psnr}; {ours_psnr}"
            row["notes"] = (f"same pair (bench_n2v.noisy_pair, seed 7; the peer makes it in its own process), "
                            f"each trained from scratch ({epochs} × {steps} steps, patch 64, batch {c['batch']}); "
                            f"peak RSS = whole process; process CPU peer {peer_cpu:.0f} s / ours {ours_cpu:.0f} s; "
                            f"load 1 min at start peer {load_peer:.2f} / ours {load_ours:.2f}")
            if key == "s_per_step":
                row["notes"] += ("; s/step: CAREamics' training wall time / steps (Lightning incl. its per-epoch "
                                 "validation on 256²), ours the training loop's wall time / steps")
            rows.add(row)


# ---------------------------------------------------------------- pipeline
def files_sha256(root, names):
    """SHA-256 over the bytes of `names` (paths relative to root), in the given order."""
    h = hashlib.sha256()
    for n in names:
        with open(os.path.join(root, n), "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def plate_images(plate):
    """The image files of OpenHCS's ImageXpress plate, relative paths in sorted order (both tools
    read these same files; hcsflow reads OpenHCS's prefix-less `<well>_s<site>_w<wave>.tif` names)."""
    return [os.path.relpath(p, plate) for p in
            sorted(glob.glob(os.path.join(plate, "TimePoint_*", "**", "*.tif"), recursive=True))]


def run_pipeline(a, suite, venvs, rows, common):
    cases = [c for c in suite["pipeline"] if selected(a, "pipeline " + c["name"])]
    if not cases:
        return
    py = venvs.python("openhcs")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for c in cases:
        row = {"section": "pipeline", "op": f"pipeline: {c['name']}", "peer": "OpenHCS", "peer_op": " ".join(c["peer_args"])}
        before = set(glob.glob(os.path.join(common.DATA, "ohcs_*")))
        env = dict(os.environ, KEEP="1")
        peer, peer_cpu = run_peer(py, a.peer_dir, "bench_openhcs.py", None, env=env, extra=c["peer_args"])
        row["peer_result"] = peer
        rows.meta["openhcs_versions"] = peer.get("versions")
        new = sorted(set(glob.glob(os.path.join(common.DATA, "ohcs_*"))) - before)
        if "error" in peer or not new:
            row["peer_error"] = peer.get("error", "OpenHCS left no plate")
            row["ours"] = {"error": "not run: no OpenHCS plate to read"}
            rows.add(row)
            continue
        t = peer["execute_s"]
        row["peer_time"] = {"median_s": t, "min_s": t, "max_s": t, "runs": 1, "cpu_median_s": None,
                            "peak_rss_mib": peer["peak_rss_mib"]}
        plate = os.path.join(new[-1], "plate")
        images = plate_images(plate)
        row["input_sha256_peer"] = files_sha256(plate, images)
        walls, cpus, secs, rss, mbps, reports = [], [], [], [], [], []
        err = None
        for i in range(c.get("repeats", 3)):
            out = os.path.join(a.work, "pipeline_out")
            shutil.rmtree(out, ignore_errors=True)
            report = os.path.join(a.work, f"pipeline_report_{i}.json")
            c0, t0 = children_cpu(), time.perf_counter()
            q = subprocess.run([a.hcsflow, "run", plate, os.path.join(repo, c["pipeline"]), out, "--device", "cpu",
                                "--report", report], capture_output=True, text=True)
            walls.append(time.perf_counter() - t0)
            cpus.append(children_cpu() - c0)
            if q.returncode != 0 or not os.path.exists(report):
                err = q.stderr[-400:].strip()
                break
            r = json.load(open(report))
            reports.append(r)
            secs.append(r["seconds"])
            mbps.append(r["mb_per_s"])
            rss.append((r.get("peak_rss_bytes") or 0) / 2**20)
        shutil.rmtree(os.path.join(a.work, "pipeline_out"), ignore_errors=True)
        row["input_sha256_ours"] = files_sha256(plate, images)  # after our runs: also shows the input unchanged
        if err:
            row["ours"] = {"error": err}
        else:
            r = reports[-1]
            row["ours"] = {"seconds": secs, "process_wall_s": walls, "process_cpu_s": cpus, "mb_per_s": mbps,
                           "peak_rss_mib": rss, "input_bytes": r["input_bytes"], "steps": [s["name"] for s in r["steps"]],
                           "workers": r.get("workers"), "device": r.get("device")}
            row["ours_time"] = {"median_s": statistics.median(secs), "min_s": min(secs), "max_s": max(secs),
                                "runs": len(secs), "cpu_median_s": statistics.median(cpus), "peak_rss_mib": max(rss)}
            planes = peer.get("images")
            row["notes"] = (f"MB/s (input pixel bytes / execution s): OpenHCS {peer['MB_per_s']}, hcsflow "
                            f"{statistics.median(mbps):.1f} (target ≥ 100); {planes} planes, "
                            f"{r['input_bytes'] / 1e6:.0f} MB; OpenHCS: its 8-step demo (normalise, composite, max-Z, "
                            f"ASHLAR positions, re-normalise, assemble, max-Z, count cells), 1 worker, plate generation "
                            f"{peer['generate_s']} s and compile {peer['compile_s']} s not counted; hcsflow: "
                            f"{c['pipeline']} steps {' → '.join(row['ours']['steps'])}, workers {r.get('workers')}, "
                            f"process wall incl. compile {statistics.median(walls):.2f} s; ours CPU = whole process; "
                            f"OpenHCS process CPU incl. plate generation {peer_cpu:.1f} s")
            row["accuracy"] = "– (different step lists; outputs not compared)"
        shutil.rmtree(new[-1], ignore_errors=True)
        rows.add(row)


# ---------------------------------------------------------------- mega flex
def synth_plate(a, common, c):
    """The case's plate, written once by `hcsflow synth` (examples/mega_flex.toml's synthetic plate, as
    `hcsflow demo --pipeline mega-flex` makes it, at the case's size) and cached in $PEERBENCH_DATA."""
    s = c["synth"]
    plate = os.path.join(common.DATA, f"mega_flex_{s['size']}px_{s['z']}z_{s['wells'].replace(',', '_')}")
    marker = os.path.join(plate, "ground_truth", "synth_config.json")
    if not os.path.exists(marker):
        shutil.rmtree(plate, ignore_errors=True)
        cfg = os.path.join(a.work, "mega_flex_synth.json")
        with open(cfg, "w") as fh:
            json.dump(s["config"], fh)
        # Flags as well as the config: `synth` applies its flags' defaults over --config.
        subprocess.run([a.hcsflow, "synth", plate, "--config", cfg, "--size", str(s["size"]), "--z", str(s["z"]),
                        "--overlap", str(s["overlap"]), "--wells", s["wells"], "--grid", f"{s['grid']}x{s['grid']}",
                        "--channels", str(s["channels"])], check=True, capture_output=True, text=True)
    return plate


def replace_steps(pipeline, drop, replacement, out):
    """`pipeline` with the [[steps]] blocks named in `drop` replaced by the TOML text `replacement` (at the
    first one; the others left out; an empty replacement leaves them all out), written to `out`."""
    text = open(pipeline).read()
    head, *blocks = re.split(r"(?m)^(?=\[\[steps\]\])", text)
    hit = [any(re.search(rf'(?m)^name = "{re.escape(d)}"$', b) for d in drop) for b in blocks]
    if sum(hit) != len(drop):
        raise ValueError(f"{pipeline}: not every step of {drop} found")
    first = hit.index(True)

    def trailing_comments(b):  # the next step's comment lines end the block before it: keep them
        m = re.search(r"(?:\n(?:#[^\n]*|[ \t]*))+$", b)
        return b[m.start() + 1:] if m else ""

    kept = []
    for i, b in enumerate(blocks):
        if not hit[i]:
            kept.append(b)
        elif i == first and replacement:
            kept.append(replacement.rstrip("\n") + "\n\n" + trailing_comments(b))
        else:
            kept.append(trailing_comments(b))
    with open(out, "w") as fh:
        fh.write(head + "".join(kept))
    return out


def torch_for_openhcs(py, work):
    """OpenHCS's N2V2 needs torch, which `pip install openhcs` does not bring. With OPENHCS_TORCH_FROM set to
    a site-packages folder holding torch (e.g. another venv's), link torch and the packages it imports from
    there into WORK/torch-for-openhcs and add that folder to the openhcs venv with a .pth file (after the
    venv's own packages), instead of downloading a second multi-GB torch. Returns whether torch imports."""
    ok = lambda: subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0  # noqa: E731
    if ok():
        return True
    src = os.environ.get("OPENHCS_TORCH_FROM")
    if not src or not os.path.isdir(os.path.join(src, "torch")):
        return False
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    links = os.path.join(work, "torch-for-openhcs")
    os.makedirs(links, exist_ok=True)
    wanted = ("torch", "torchgen", "functorch", "triton", "nvidia", "cuda", "sympy", "mpmath", "isympy.py", "jinja2",
              "markupsafe", "filelock", "networkx", "typing_extensions.py", "fsspec")
    for name in os.listdir(src):
        base = re.split(r"-\d", name)[0].replace("-", "_").lower()
        hit = name in wanted or any(base == w or base.startswith(w + "_") for w in wanted if not w.endswith(".py"))
        if hit and not os.path.exists(os.path.join(site, name)) and not os.path.exists(os.path.join(links, name)):
            os.symlink(os.path.join(src, name), os.path.join(links, name))
    with open(os.path.join(site, "zz_torch_for_openhcs.pth"), "w") as fh:
        fh.write(links + "\n")
    return ok()


def peer_settings(pipeline):
    """The settings the peer matches, read from our pipeline file: Richardson–Lucy's iterations and PSF σ,
    N2V2's total training steps, patch and batch, as bench_openhcs_mega_flex.py's flags."""
    import tomllib

    funcs = []
    for step in tomllib.load(open(pipeline, "rb"))["steps"]:
        f = step.get("func")
        for g in (f if isinstance(f, list) else list(f.values()) if isinstance(f, dict) and "name" not in f else [f]):
            funcs.append({"name": g, "args": {}} if isinstance(g, str) else g)
    args = {f["name"]: f.get("args", {}) for f in funcs if isinstance(f, dict)}
    rl, n2v = args.get("richardson_lucy", {}), args.get("n2v_denoise", {})
    out = []
    for flag, v in (("--rl-iterations", rl.get("iterations")), ("--rl-sigma-xy", rl.get("sigma_xy")),
                    ("--rl-sigma-z", rl.get("sigma_z")), ("--n2v-patch", n2v.get("patch_size")),
                    ("--n2v-batch", n2v.get("batch_size"))):
        if v is not None:
            out += [flag, str(v)]
    if n2v.get("epochs") and n2v.get("steps_per_epoch"):
        out += ["--n2v-steps", str(n2v["epochs"] * n2v["steps_per_epoch"])]
    return out


def run_ours_pipeline(a, plate, pipeline, repeats, tag):
    """`hcsflow run PLATE pipeline OUT --device cpu` `repeats` times: (report fields, process wall, CPU, peak RSS
    MiB from the report), or an error string."""
    secs, walls, cpus, rss, mbps, reports = [], [], [], [], [], []
    for i in range(repeats):
        out = os.path.join(a.work, f"mega_flex_out_{tag}")
        shutil.rmtree(out, ignore_errors=True)
        report = os.path.join(a.work, f"mega_flex_report_{tag}_{i}.json")
        c0, t0 = children_cpu(), time.perf_counter()
        q = subprocess.run([a.hcsflow, "run", plate, pipeline, out, "--device", "cpu", "--report", report],
                           capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        cpus.append(children_cpu() - c0)
        shutil.rmtree(out, ignore_errors=True)
        if q.returncode != 0 or not os.path.exists(report):
            return q.stderr[-400:].strip() or f"exit {q.returncode}"
        r = json.load(open(report))
        if r.get("failures"):
            return "; ".join(f"{f.get('well')}: {f.get('error')}" for f in r["failures"])[:400]
        reports.append(r)
        secs.append(r["seconds"])
        mbps.append(r["mb_per_s"])
        rss.append((r.get("peak_rss_bytes") or 0) / 2**20)
    r = reports[-1]
    steps = {s["name"]: s for s in r["steps"]}
    return {"seconds": secs, "process_wall_s": walls, "process_cpu_s": cpus, "mb_per_s": mbps, "peak_rss_mib": rss,
            "input_bytes": r["input_bytes"], "steps": list(steps), "workers": r.get("workers"),
            "step_seconds": {k: sum(v.get(f"{p}_seconds") or 0 for p in ("read", "compute", "write"))
                             for k, v in steps.items()},
            "time": {"median_s": statistics.median(secs), "min_s": min(secs), "max_s": max(secs), "runs": len(secs),
                     "cpu_median_s": statistics.median(cpus), "peak_rss_mib": max(rss)}}


def run_mega_flex(a, suite, venvs, rows, common):
    """examples/mega_flex.toml against OpenHCS running the same steps (bench/peers/bench_openhcs_mega_flex.py)
    on one `hcsflow synth` plate, interleaved (peer, ours). Rows: end to end without N2V2 (both measured);
    N2V2 alone (ours: the step's time in our full run; OpenHCS: its own N2V2 code, CUDA guard removed,
    timed on one plane and extrapolated to the plate); end to end with N2V2 (ours measured; OpenHCS = its
    measured run + its extrapolated N2V2)."""
    cases = [c for c in suite.get("mega_flex", []) if selected(a, "mega_flex " + c["name"])]
    if not cases:
        return
    py = venvs.python("openhcs")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for c in cases:
        plate = synth_plate(a, common, c)
        images = plate_images(plate)
        sums = files_sha256(plate, images)
        s = c["synth"]
        peer_args = ["--plate", plate, "--grid", str(s["grid"]), "--overlap", str(s["overlap"]), "--z", str(s["z"]),
                     "--channels", str(s["channels"])]
        full = os.path.join(repo, c["pipeline"])
        peer_args += peer_settings(full)
        drop = c.get("n2v_steps", ["denoised"])
        no_n2v = replace_steps(full, drop, c.get("n2v_replacement", ""), os.path.join(a.work, "mega_flex_no_n2v.toml"))
        load = {"start": os.getloadavg()[0]}
        peer, peer_cpu = run_peer(py, a.peer_dir, "bench_openhcs_mega_flex.py", None, extra=peer_args + ["--n2v", "skip"])
        load["ours"] = os.getloadavg()[0]
        ours = run_ours_pipeline(a, plate, no_n2v, c.get("repeats", 1), "no_n2v")
        if torch_for_openhcs(py, os.path.dirname(a.work)):
            probe, _ = run_peer(py, a.peer_dir, "bench_openhcs_mega_flex.py", None, extra=peer_args + ["--n2v", "probe"])
        else:
            probe = {"error": "not run: no torch in the openhcs venv (set OPENHCS_TORCH_FROM to a site-packages with torch)"}
        load["ours_full"] = os.getloadavg()[0]
        ours_full = run_ours_pipeline(a, plate, full, c.get("repeats", 1), "full")
        load["end"] = os.getloadavg()[0]
        rows.meta["openhcs_versions"] = peer.get("versions") or probe.get("versions")
        mb = sum(os.path.getsize(os.path.join(plate, i)) for i in images) / 1e6
        what = (f"{len(images)} planes, {mb:.0f} MB (hcsflow synth: {s['wells']}, {s['grid']}×{s['grid']} sites, "
                f"{s['channels']} ch, {s['z']} z, {s['size']}²); load 1 min peer {load['start']:.1f} / ours "
                f"{load['ours']:.1f} / ours with N2V2 {load['ours_full']:.1f}")
        base = {"section": "mega_flex", "peer": "OpenHCS", "input_sha256_peer": sums, "input_sha256_ours": sums}

        # 1. End to end without N2V2: both sides measured.
        row = dict(base, op=f"mega flex without N2V2: {c['name']}", peer_op="--n2v skip", peer_result=peer)
        if "error" in peer:
            row["peer_error"] = peer["error"]
        else:
            row["peer_time"] = {"median_s": peer["execute_s"], "min_s": peer["execute_s"], "max_s": peer["execute_s"],
                                "runs": 1, "cpu_median_s": None, "peak_rss_mib": peer["peak_rss_mib"]}
        if isinstance(ours, str):
            row["ours"] = {"error": ours}
        else:
            row["ours"], row["ours_time"] = ours, ours["time"]
        mbps = lambda t: f"{mb / t:.2f}" if t else "–"  # noqa: E731
        row["notes"] = (f"{what}; MB/s OpenHCS {mbps(peer.get('execute_s'))}, hcsflow "
                        f"{mbps(row.get('ours_time', {}).get('median_s'))}; ours: {c['pipeline']} with "
                        f"{', '.join(drop)} replaced by {c.get('n2v_replacement_what', 'nothing')}, process wall incl. compile "
                        f"{statistics.median(ours['process_wall_s']) if not isinstance(ours, str) else 0:.1f} s; "
                        f"OpenHCS: execution only (compile {peer.get('compile_s', '–')} s not counted), 1 worker, "
                        f"process CPU {peer_cpu:.0f} s; {c.get('peer_note', '')}")
        row["accuracy"] = "– (same steps, different implementations; outputs not compared)"
        rows.add(row)

        # 2. N2V2 alone.
        row = dict(base, op=f"mega flex N2V2 step: {c['name']}", peer_op="--n2v probe", peer_result=probe)
        ours_n2v = None if isinstance(ours_full, str) else sum(
            ours_full["step_seconds"].get(d) or 0 for d in drop) or None
        if "error" in probe:
            row["peer_error"] = probe["error"]
        else:
            est = probe["n2v_estimated_plate_s"]
            row["peer_time"] = {"median_s": est, "min_s": est, "max_s": est, "runs": 1, "cpu_median_s": None,
                                "peak_rss_mib": probe["peak_rss_mib"]}
        if ours_n2v:
            row["ours_time"] = {"median_s": ours_n2v, "min_s": ours_n2v, "max_s": ours_n2v, "runs": 1,
                                "cpu_median_s": None, "peak_rss_mib": None}
            row["ours"] = {"step_seconds": ours_n2v}
        else:
            row["ours"] = {"error": ours_full if isinstance(ours_full, str) else "no N2V2 step time in the report"}
        row["notes"] = ("OpenHCS: ESTIMATE — its n2v2_denoise_torch refuses CPU tensors (CUDA required); its own code "
                        "with that guard removed, timed on one plane: "
                        f"{probe.get('n2v_s_per_train_step', '–')} s per training step (batch 16 × 64²), "
                        f"{probe.get('n2v_s_per_plane_predict', '–')} s per plane predicted, × "
                        f"{probe.get('n2v_models', '–')} models × {probe.get('n2v_train_steps_per_model', '–')} steps "
                        f"+ {probe.get('n2v_planes', '–')} planes; peak RSS of the one-plane probe. Ours: the "
                        f"`{', '.join(drop)}` step's time in our full run (2 models × 200 steps, every plane); {what}")
        row["accuracy"] = "–"
        rows.add(row)

        # 3. End to end with N2V2.
        row = dict(base, op=f"mega flex end to end: {c['name']}", peer_op="--n2v skip + probe")
        if "error" not in peer and "error" not in probe:
            t = peer["execute_s"] + probe["n2v_estimated_plate_s"]
            row["peer_time"] = {"median_s": t, "min_s": t, "max_s": t, "runs": 1, "cpu_median_s": None,
                                "peak_rss_mib": max(peer["peak_rss_mib"], probe["peak_rss_mib"])}
        else:
            row["peer_error"] = peer.get("error") or probe.get("error")
        if isinstance(ours_full, str):
            row["ours"] = {"error": ours_full}
        else:
            row["ours"], row["ours_time"] = ours_full, ours_full["time"]
        row["notes"] = (f"OpenHCS: ESTIMATE = its measured run without N2V2 + its extrapolated N2V2 (rows above); "
                        f"peak RSS the larger of the two processes. Ours: {c['pipeline']} measured, MB/s "
                        f"{mbps(row.get('ours_time', {}).get('median_s'))}; {what}")
        row["accuracy"] = "–"
        rows.add(row)


# ---------------------------------------------------------------- table
def fmt_time(t):
    if not t or t.get("median_s") is None:
        return "–"
    if t.get("runs") == 1:
        return f"{t['median_s']:.4g} (1 run)"
    return f"{t['median_s']:.4g} ({t['min_s']:.4g}–{t['max_s']:.4g})"


def fmt_num(v, spec):
    return "–" if v is None else format(v, spec)


def cell(s):
    return str(s).replace("|", "/").replace("\n", " ")


def markdown(rows):
    out = ["| operation | peer | peer s, median (min–max) | hcsflow s, median (min–max) | ratio peer/ours | "
           "CPU s peer / ours | peak RSS MiB peer / ours | input SHA-256 peer / ours | accuracy | notes |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pt, ot = r.get("peer_time"), r.get("ours_time")
        peer_s = fmt_time(pt) if pt else (r.get("peer_error") or "–")[:80]
        ours_s = fmt_time(ot) if ot else r.get("ours", {}).get("error", "–")[:80]
        ratio = f"{pt['median_s'] / ot['median_s']:.1f}×" if pt and ot and ot["median_s"] else "–"
        cpu = f"{fmt_num((pt or {}).get('cpu_median_s'), '.3g')} / {fmt_num((ot or {}).get('cpu_median_s'), '.3g')}"
        rss = f"{fmt_num((pt or {}).get('peak_rss_mib'), '.0f')} / {fmt_num((ot or {}).get('peak_rss_mib'), '.0f')}"
        sp, so = r.get("input_sha256_peer"), r.get("input_sha256_ours")
        if sp and so:
            sums = f"{sp[:12]} / {so[:12]} ({'identical' if sp == so else 'DIFFERENT'})"
        else:
            sums = f"{(sp or '–')[:12]} / {(so or '–')[:12]}"
        out.append("| " + " | ".join(cell(x) for x in (r["op"], r["peer"], peer_s, ours_s, ratio, cpu, rss, sums,
                                                        r.get("accuracy", "–"), r.get("notes", ""))) + " |")
    return "\n".join(out)


class Results:
    """The rows so far, written out after every row (WORK/bench-vs-peers.{json,md}), so an
    interrupted run still leaves the table of what it measured."""

    def __init__(self, work, meta):
        self.work, self.meta, self.rows = work, meta, []

    def add(self, row):
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        self.save()

    def save(self):
        self.meta.update(finished=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), loadavg_end=os.getloadavg())
        with open(os.path.join(self.work, "bench-vs-peers.json"), "w") as fh:
            json.dump({"meta": self.meta, "rows": self.rows}, fh, indent=1)
        with open(os.path.join(self.work, "bench-vs-peers.md"), "w") as fh:
            fh.write(markdown(self.rows) + "\n\n" + self.footer() + "\n")

    def footer(self):
        m = self.meta
        return (f"{m['started']} → {m['finished']}, hcsflow {m['hcsflow_commit']}, load average "
                f"{m['loadavg_start'][0]:.1f} → {m['loadavg_end'][0]:.1f} on {m['cpus']} CPUs")


def selected(a, name):
    """No --only, or one of its comma-separated words is in `name` (case-insensitive)."""
    return not a.only or any(s.lower() in name.lower() for s in a.only.split(","))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer-dir", required=True)
    ap.add_argument("--hcsflow", required=True, help="path to the hcsflow binary")
    ap.add_argument("--suite", required=True)
    ap.add_argument("--work", required=True, help="results folder")
    ap.add_argument("--venvs", help="folder of the peer virtualenvs (default: the parent of --work)")
    ap.add_argument("--only", help="comma-separated substrings of op names (ops: the peer op; 'stitch', 'pipeline')")
    ap.add_argument("--sections", default="ops,stitch,pipeline,mega_flex,n2v")
    ap.add_argument("--n2v-bin", help="path to hcsflow-n2v's bench_n2v example (the n2v section)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--reference", nargs=3, metavar=("SCRIPT", "OP", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.reference:
        return reference(a.peer_dir, *a.reference)
    a.peer_dir, a.work, a.suite = os.path.abspath(a.peer_dir), os.path.abspath(a.work), os.path.abspath(a.suite)
    os.makedirs(a.work, exist_ok=True)

    sys.path.insert(0, a.peer_dir)
    import common  # the peers' input generators (cached under $PEERBENCH_DATA)

    suite = json.load(open(a.suite))
    venvs = Venvs(a.venvs or os.path.dirname(a.work), suite["venvs"], suite.get("heavy_venvs", []),
                  os.environ.get("PEERS_HEAVY") == "1")
    registered = {f["name"] for f in json.loads(subprocess.run([a.hcsflow, "functions", "--json"], capture_output=True,
                                                                text=True, check=True).stdout)}
    sections = a.sections.split(",")
    git = subprocess.run(["git", "-C", os.path.dirname(a.suite), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    meta = {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "hcsflow_commit": git,
            "versions": common.versions("numpy", "scipy", "skimage"), "loadavg_start": os.getloadavg(),
            "cpus": os.cpu_count()}
    rows = Results(a.work, meta)
    # Longest and most telling first: an interrupted run keeps the end-to-end and stitching rows.
    if "pipeline" in sections:
        run_pipeline(a, suite, venvs, rows, common)
    if "mega_flex" in sections:
        run_mega_flex(a, suite, venvs, rows, common)
    if "stitch" in sections:
        run_stitch(a, suite, venvs, rows)
    if "n2v" in sections:
        run_n2v(a, suite, venvs, rows)
    if "ops" in sections:
        run_ops(a, suite, venvs, registered, common, rows)
    rows.save()
    print()
    print(markdown(rows.rows))
    print()
    print(rows.footer() + "; peers' versions in bench-vs-peers.json")


if __name__ == "__main__":
    main()
