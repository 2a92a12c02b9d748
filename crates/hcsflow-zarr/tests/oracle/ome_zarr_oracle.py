#!/usr/bin/env python3
"""Independent check of an hcsflow OME-Zarr plate with zarr-python, ome-zarr-py
and ome-zarr-models (pydantic models of the NGFF 0.4/0.5 specs).

usage: ome_zarr_oracle.py PLATE_ROOT EXPECTED_DIR

EXPECTED_DIR/expected.json describes what the plate must contain (written by
the Rust test): NGFF version, dtype, channel names, axes, the wells and fields
present, and per level the shape, scale and optionally the chunk shape (default:
one chunk per plane). EXPECTED_DIR/<row>_<col>_<field>_<level>.bin
holds the expected pixels of that level (little-endian, C order, [t,c,z,y,x]).

Prints one line per check and `ORACLE OK ...` at the end; exits 1 listing the
failures otherwise.
"""
import json
import sys
from pathlib import Path

import numpy as np
import zarr
from ome_zarr.io import parse_url
from ome_zarr.reader import Multiscales, OMERO, Plate, Reader

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL {what}")
    return cond


def expected_pixels(exp_dir, well_path, field, level, shape, dtype):
    row, col = well_path.split("/")
    raw = (exp_dir / f"{row}_{col}_{field}_{level}.bin").read_bytes()
    return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)


def ngff(attrs, version):
    """NGFF attributes: under "ome" for 0.5, top level for 0.4."""
    attrs = dict(attrs)
    if version == "0.5":
        ome = attrs.get("ome", {})
        check(ome.get("version") == "0.5", f"attributes.ome.version is 0.5 (got {ome.get('version')!r})")
        return ome
    return attrs


def with_zarr_python(root, exp, exp_dir):
    version = exp["version"]
    zarr_format = 3 if version == "0.5" else 2
    plate_group = zarr.open_group(str(root), mode="r", zarr_format=zarr_format)
    plate = ngff(plate_group.attrs, version)["plate"]
    check([r["name"] for r in plate["rows"]] == exp["rows"], f"zarr: plate rows {plate['rows']}")
    check([c["name"] for c in plate["columns"]] == exp["columns"], f"zarr: plate columns {plate['columns']}")
    wells = {w["path"]: w for w in plate["wells"]}
    check(sorted(wells) == sorted(w["path"] for w in exp["wells"]), f"zarr: plate wells {sorted(wells)}")
    check(plate.get("field_count") == exp["field_count"], f"zarr: field_count {plate.get('field_count')}")
    for w in exp["wells"]:
        pw = wells.get(w["path"], {})
        row, col = w["path"].split("/")
        check(pw.get("rowIndex") == exp["rows"].index(row), f"zarr: {w['path']} rowIndex")
        check(pw.get("columnIndex") == exp["columns"].index(col), f"zarr: {w['path']} columnIndex")
        well = ngff(plate_group[w["path"]].attrs, version)["well"]
        images = [i["path"] for i in well["images"]]
        check(images == [str(f) for f in w["fields"]], f"zarr: {w['path']} images {images}")
        for f in w["fields"]:
            image = plate_group[f"{w['path']}/{f}"]
            ms = ngff(image.attrs, version)["multiscales"][0]
            axes = [(a["name"], a.get("type"), a.get("unit")) for a in ms["axes"]]
            check(axes == [tuple(a) for a in exp["axes"]], f"zarr: {w['path']}/{f} axes {axes}")
            labels = [c["label"] for c in ngff(image.attrs, version)["omero"]["channels"]]
            check(labels == exp["channel_names"], f"zarr: {w['path']}/{f} channel labels {labels}")
            for level, lev in enumerate(exp["levels"]):
                ds = ms["datasets"][level]
                scale = ds["coordinateTransformations"][0]["scale"]
                check(np.allclose(scale, lev["scale"]), f"zarr: {w['path']}/{f}/{level} scale {scale}")
                arr = image[ds["path"]]
                ok = check(tuple(arr.shape) == tuple(lev["shape"]), f"zarr: {w['path']}/{f}/{level} shape {arr.shape}")
                check(arr.dtype == np.dtype(exp["dtype"]), f"zarr: {w['path']}/{f}/{level} dtype {arr.dtype}")
                chunks = tuple(lev.get("chunks", (1, 1, 1, *lev["shape"][3:])))
                check(tuple(arr.chunks) == chunks, f"zarr: chunks {arr.chunks} != {chunks}")
                if ok:
                    want = expected_pixels(exp_dir, w["path"], f, level, lev["shape"], exp["dtype"])
                    same = check(np.array_equal(arr[...], want), f"zarr: {w['path']}/{f}/{level} pixels")
                    print(f"zarr-python: {w['path']}/{f}/{level} shape={tuple(arr.shape)} dtype={arr.dtype} "
                          f"scale={scale} pixels={'ok' if same else 'MISMATCH'}")


def with_ome_zarr(root, exp, exp_dir):
    plate_nodes = list(Reader(parse_url(str(root)))())
    check(bool(plate_nodes) and plate_nodes[0].load(Plate) is not None, "ome-zarr: root is read as a Plate")
    if plate_nodes:
        meta = plate_nodes[0].metadata.get("metadata", {}).get("plate", {})
        check(len(meta.get("wells", [])) == len(exp["wells"]), "ome-zarr: plate wells")
        # The stitched plate view napari shows: rows*Y by columns*X at level 0.
        grid = plate_nodes[0].data[0]
        lev0 = exp["levels"][0]["shape"]
        want = (*lev0[:3], lev0[3] * len(exp["rows"]), lev0[4] * len(exp["columns"]))
        check(tuple(grid.shape) == want, f"ome-zarr: stitched plate shape {grid.shape} != {want}")
        print(f"ome-zarr: plate grid shape={tuple(grid.shape)}")
    n = 0
    for w in exp["wells"]:
        for f in w["fields"]:
            nodes = list(Reader(parse_url(str(root / w["path"] / str(f))))())
            node = nodes[0] if nodes else None
            if not check(node is not None and node.load(Multiscales) is not None,
                         f"ome-zarr: {w['path']}/{f} is a multiscale image"):
                continue
            axes = [(a["name"], a.get("type"), a.get("unit")) for a in node.metadata["axes"]]
            check(axes == [tuple(a) for a in exp["axes"]], f"ome-zarr: {w['path']}/{f} axes {axes}")
            check(node.load(OMERO) is not None, f"ome-zarr: {w['path']}/{f} has omero")
            names = node.metadata.get("channel_names")
            check(names == exp["channel_names"], f"ome-zarr: {w['path']}/{f} channel_names {names}")
            transforms = node.metadata.get("coordinateTransformations", [])
            check(len(node.data) == len(exp["levels"]), f"ome-zarr: {w['path']}/{f} levels {len(node.data)}")
            for level, (data, lev) in enumerate(zip(node.data, exp["levels"])):
                scale = transforms[level][0]["scale"] if level < len(transforms) else None
                check(scale is not None and np.allclose(scale, lev["scale"]),
                      f"ome-zarr: {w['path']}/{f}/{level} scale {scale}")
                ok = check(tuple(data.shape) == tuple(lev["shape"]),
                           f"ome-zarr: {w['path']}/{f}/{level} shape {data.shape}")
                if ok:
                    want = expected_pixels(exp_dir, w["path"], f, level, lev["shape"], exp["dtype"])
                    same = check(np.array_equal(np.asarray(data), want), f"ome-zarr: {w['path']}/{f}/{level} pixels")
                    print(f"ome-zarr: {w['path']}/{f}/{level} shape={tuple(data.shape)} axes={[a[0] for a in axes]} "
                          f"scale={scale} channels={names} pixels={'ok' if same else 'MISMATCH'}")
            n += 1
    return n


def with_ome_zarr_models(root, exp):
    """Validates the whole hierarchy (plate, wells, images) against the spec models."""
    version = exp["version"]
    if version == "0.5":
        from ome_zarr_models.v05 import HCS
    else:
        from ome_zarr_models.v04 import HCS
    group = zarr.open_group(str(root), mode="r", zarr_format=3 if version == "0.5" else 2)
    try:
        hcs = HCS.from_zarr(group)
    except Exception as e:  # any validation error is a failure with its message
        check(False, f"ome-zarr-models: HCS {version} validation: {type(e).__name__}: {e}")
        return
    n_wells = len(list(hcs.well_groups))
    check(n_wells == len(exp["wells"]), f"ome-zarr-models: {n_wells} wells")
    print(f"ome-zarr-models: plate is a valid NGFF {version} HCS plate ({n_wells} wells)")


def main():
    root, exp_dir = Path(sys.argv[1]), Path(sys.argv[2])
    exp = json.loads((exp_dir / "expected.json").read_text())
    print(f"zarr-python {zarr.__version__}, numpy {np.__version__}, NGFF {exp['version']}")
    with_zarr_python(root, exp, exp_dir)
    n = with_ome_zarr(root, exp, exp_dir)
    with_ome_zarr_models(root, exp)
    if failures:
        print(f"ORACLE FAILED: {len(failures)} check(s)")
        sys.exit(1)
    print(f"ORACLE OK: NGFF {exp['version']}, {n} fields in {len(exp['wells'])} wells")


if __name__ == "__main__":
    main()
