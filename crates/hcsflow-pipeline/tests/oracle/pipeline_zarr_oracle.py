#!/usr/bin/env python3
"""Independent check of a pipeline step's OME-Zarr plate against the TIFF
output of the same step, with tifffile, zarr-python, ome-zarr-py and
ome-zarr-models.

usage: pipeline_zarr_oracle.py ZARR_ROOT TIFF_STEP_DIR EXPECTED_JSON WORK_DIR

EXPECTED_JSON (written by the Rust test from the synthetic plate's
configuration, not from our plate reader) gives the NGFF version, plate name,
rows, columns, wells, fields per well, channel names, the field shape
(t, c, z, y, x), dtype, pyramid levels, pixel size in µm (null = unknown) and
the plate's field size (y, x), which is the chunk size on level 0 (ceil(n/2^k)
on level k). A null y, x in the shape means planes of any size (whole-well
mosaics): the expected extent is then the largest TIFF plane of the step, and
every plane, on every pyramid level, is padded with 0 at the bottom and right
to that extent.

The expected pixels come from the step's TIFF files, read with tifffile and
placed by their ImageXpress names (`.../TimePoint_<t>/[ZStep_<z>/]<plate>_<well>_s<site>_w<channel>.tif`):
fields, channels, z planes and timepoints in numeric order of site, `w`,
`ZStep` and `TimePoint`. Pyramid levels are computed here with numpy (mean of
each 2^k × 2^k block of level 0, fewer at odd edges, rounded half to even).
These expectations are handed to the checks of the hcsflow-zarr oracle
(crates/hcsflow-zarr/tests/oracle/ome_zarr_oracle.py: zarr-python,
ome-zarr-py's Reader, ome-zarr-models' HCS validation), which compare shape,
dtype, axes with types and units, scale per level, channel labels, plate
rows/columns/wells and every pixel of every level.

With `--labels NAME` first, the step is a label step whose planes the
pipeline writes as NGFF label images named NAME under the fields of the image
plate ZARR_ROOT: the expected label values (every field of every well, from
the TIFFs as above, padded with 0 to the largest TIFF plane) are handed to
crates/hcsflow-zarr/tests/oracle/ngff_labels_oracle.py, which reads them with
ome-zarr-py (napari's reader: the labels listed under each field, values on
every level), zarr-python and ome-zarr-models.

Prints one line per check and `PIPELINE ORACLE OK ...` at the end; exits 1
listing the failures otherwise.
"""
import json
import re
import sys
from pathlib import Path

import numpy as np
import tifffile

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "hcsflow-zarr" / "tests" / "oracle"))
import ome_zarr_oracle as zo  # noqa: E402  (the shared zarr-python / ome-zarr checks)
import ngff_labels_oracle as lo  # noqa: E402  (the label-image checks)

NAME = re.compile(r"_(?P<well>[A-Za-z]+\d+)_s(?P<site>\d+)_w(?P<ch>\d+)(?:_[0-9A-Fa-f-]{36})?\.tiff?$")


def tiff_planes(step_dir):
    """(well, site, channel, z, t) -> 2D array, from the names of the TIFF files."""
    planes = {}
    for path in sorted(step_dir.rglob("*.tif*")):
        if path.name.startswith("."):
            continue
        m = NAME.search(path.name)
        if not zo.check(m is not None, f"tiff: {path} has an ImageXpress name"):
            continue
        rel = path.relative_to(step_dir).parts[:-1]
        z = next((int(p[len("ZStep_"):]) for p in rel if p.startswith("ZStep_")), 0)
        t = next((int(p[len("TimePoint_"):]) for p in rel if p.startswith("TimePoint_")), 1)
        data = tifffile.imread(path)
        zo.check(data.ndim == 2, f"tiff: {path} is one plane (shape {data.shape})")
        planes[(m["well"].upper(), int(m["site"]), int(m["ch"]), z, t)] = data
    return planes


def block_mean(plane, k):
    """Level k of the pyramid: mean of each 2^k block of level 0, rounded half to even."""
    b = 1 << k
    h, w = plane.shape
    lh, lw = -(-h // b), -(-w // b)
    padded = np.zeros((lh * b, lw * b), dtype=np.float64)
    counts = np.zeros_like(padded)
    padded[:h, :w] = plane
    counts[:h, :w] = 1.0
    sums = padded.reshape(lh, b, lw, b).sum(axis=(1, 3))
    n = counts.reshape(lh, b, lw, b).sum(axis=(1, 3))
    mean = sums / n
    if np.issubdtype(plane.dtype, np.integer):
        info = np.iinfo(plane.dtype)
        return np.clip(np.round(mean), info.min, info.max).astype(plane.dtype)
    return mean.astype(plane.dtype)


def well_path(name):
    m = re.fullmatch(r"([A-Za-z]+)(\d+)", name)
    return f"{m[1].upper()}/{int(m[2])}"


def check_labels(name, root, step_dir, spec, work):
    """The step's TIFF planes as label image `name` under every field of the image plate `root`."""
    planes = tiff_planes(step_dir)
    zo.check(bool(planes), f"tiff: {step_dir} has output planes")
    y_ = max(p.shape[0] for p in planes.values())
    x_ = max(p.shape[1] for p in planes.values())
    sites, chans, zs, ts = ([sorted({k[i] for k in planes}) for i in range(5)])[1:]
    zo.check(len(chans) == 1, f"tiff: one channel of labels, found {chans}")
    fields = {}
    for well in spec["wells"]:
        path = well_path(well)
        for fi, site in enumerate(sites):
            level0 = np.zeros((len(ts), 1, len(zs), y_, x_), dtype="<u2")
            for ti, t in enumerate(ts):
                for zi, z in enumerate(zs):
                    plane = planes.get((well.upper(), site, chans[0], z, t))
                    if zo.check(plane is not None, f"tiff: {well} site {site} z{z} t{t} exists"):
                        level0[ti, 0, zi, :plane.shape[0], :plane.shape[1]] = plane
            field = f"{path}/{fi}"
            fields[field] = [name]
            (work / f"{field.replace('/', '_')}_{name}.bin").write_bytes(level0.tobytes())
    expected = {"version": spec["version"], "levels": spec["levels"], "shape": [len(ts), 1, len(zs), y_, x_], "fields": fields}
    (work / "labels.json").write_text(json.dumps(expected, indent=1))
    lo.with_ome_zarr(root, expected, work)
    lo.with_zarr_and_models(root, expected)
    failures = zo.failures + lo.failures
    if failures:
        print(f"PIPELINE ORACLE FAILED: {len(failures)} check(s)")
        sys.exit(1)
    print(f"PIPELINE ORACLE OK: NGFF {spec['version']}, labels '{name}' of {len(fields)} fields equal the TIFF output")


def main():
    if sys.argv[1] == "--labels":
        name = sys.argv[2]
        root, step_dir, spec_path, work = (Path(a) for a in sys.argv[3:7])
        work.mkdir(parents=True, exist_ok=True)
        return check_labels(name, root, step_dir, json.loads(spec_path.read_text()), work)
    root, step_dir, spec_path, work = (Path(a) for a in sys.argv[1:5])
    spec = json.loads(spec_path.read_text())
    work.mkdir(parents=True, exist_ok=True)
    planes = tiff_planes(step_dir)
    zo.check(bool(planes), f"tiff: {step_dir} has output planes")
    t_, c_, z_, y_, x_ = spec["shape"]
    padded = y_ is None
    if padded:
        y_ = max(p.shape[0] for p in planes.values())
        x_ = max(p.shape[1] for p in planes.values())
        sizes = sorted({p.shape for p in planes.values()})
        print(f"tiff: planes of any size (mosaics): {sizes}; fields padded to the largest, {y_} x {x_}")
    values = [sorted({k[i] for k in planes}) for i in range(5)]  # well, site, ch, z, t
    sites, chans, zs, ts = values[1], values[2], values[3], values[4]
    zo.check(len(sites) == spec["fields"], f"tiff: {len(sites)} sites, expected {spec['fields']}")
    zo.check((len(ts), len(chans), len(zs)) == (t_, c_, z_), f"tiff: t/c/z counts {(len(ts), len(chans), len(zs))} != {(t_, c_, z_)}")
    dtype = np.dtype(spec["dtype"])
    for k, p in planes.items():
        fits = p.shape[0] <= y_ and p.shape[1] <= x_ if padded else p.shape == (y_, x_)
        zo.check(fits and p.dtype == dtype, f"tiff: {k} shape {p.shape} dtype {p.dtype}")

    levels = spec["levels"]
    py = px = spec["pixel_size_um"] if spec["pixel_size_um"] is not None else 1.0
    fy, fx = spec["field_size"]
    exp_levels = []
    for k in range(levels):
        f = float(1 << k)
        exp_levels.append({"shape": [t_, c_, z_, -(-y_ // (1 << k)), -(-x_ // (1 << k))],
                           "chunks": [1, 1, 1, -(-fy // (1 << k)), -(-fx // (1 << k))],
                           "scale": [1.0, 1.0, 1.0, py * f, px * f]})
    unit = "micrometer" if spec["pixel_size_um"] is not None else None
    wells = []
    for well in spec["wells"]:
        path = well_path(well)
        wells.append({"path": path, "fields": list(range(spec["fields"]))})
        row, col = path.split("/")
        for fi, site in enumerate(sites):
            # Level k of each plane is computed from the plane itself, then
            # padded with 0 to the level's extent (a no-op for field-sized planes).
            fields = [np.zeros(lev["shape"], dtype=dtype) for lev in exp_levels]
            for ti, t in enumerate(ts):
                for ci, ch in enumerate(chans):
                    for zi, z in enumerate(zs):
                        plane = planes.get((well.upper(), site, ch, z, t))
                        if not zo.check(plane is not None, f"tiff: {well} site {site} w{ch} z{z} t{t} exists"):
                            continue
                        for k in range(levels):
                            lev = block_mean(plane, k)
                            fields[k][ti, ci, zi, :lev.shape[0], :lev.shape[1]] = lev
            for k in range(levels):
                lev = fields[k].astype(dtype.newbyteorder("<"))
                (work / f"{row}_{col}_{fi}_{k}.bin").write_bytes(lev.tobytes())
    expected = {
        "version": spec["version"],
        "dtype": dtype.name,
        "rows": spec["rows"],
        "columns": spec["columns"],
        "channel_names": spec["channel_names"],
        "field_count": spec["fields"],
        "axes": [["t", "time", None], ["c", "channel", None], ["z", "space", None],
                 ["y", "space", unit], ["x", "space", unit]],
        "levels": exp_levels,
        "wells": wells,
    }
    (work / "expected.json").write_text(json.dumps(expected, indent=1))
    print(f"tifffile {tifffile.__version__}: {len(planes)} planes in {step_dir}")

    zo.with_zarr_python(root, expected, work)
    n = zo.with_ome_zarr(root, expected, work)
    zo.with_ome_zarr_models(root, expected)
    # The plate's own name, which the shared checks do not look at.
    import zarr
    group = zarr.open_group(str(root), mode="r", zarr_format=3 if spec["version"] == "0.5" else 2)
    plate = zo.ngff(group.attrs, spec["version"])["plate"]
    zo.check(plate.get("name") == spec["plate_name"], f"zarr: plate name {plate.get('name')!r}")
    if zo.failures:
        print(f"PIPELINE ORACLE FAILED: {len(zo.failures)} check(s)")
        sys.exit(1)
    print(f"PIPELINE ORACLE OK: NGFF {spec['version']}, {n} fields in {len(wells)} wells equal the TIFF output")


if __name__ == "__main__":
    main()
