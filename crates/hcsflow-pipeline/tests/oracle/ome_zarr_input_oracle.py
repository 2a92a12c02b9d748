"""OME-Zarr HCS plates written by ome-zarr-py, as hcsflow inputs.

    write DIR           writes two plates into DIR and DIR/expected.json:
        p04_blosc.zarr  NGFF 0.4 (Zarr v2), numcodecs Blosc(lz4) chunks; wells A/1
                        and B/2, 2 fields each, axes c z y x (2 channels labelled
                        DAPI and GFP in `omero`, 3 z, 24 x 20 uint16), scale
                        z 2 / y x 0.5 micrometer, 2 pyramid levels; the fields'
                        level-0 translations set one field width apart in x (as
                        a writer that records stage positions does)
        p05.zarr        NGFF 0.5 (Zarr v3), ome-zarr-py's default codec; wells A/1
                        and A/2, 1 field each, axes t c z y x (2 t, 1 c, 2 z,
                        16 x 16 uint8), no omero block, no units
    check ZARR TIFFS    every TIFF under TIFFS named WELL_sS_wC_zZ_tT.tif (hcsflow's
                        name for a plane of a container) equals, exactly, the max
                        over z of that well's field S-1, channel C, time point T, read
                        from ZARR's level 0 with zarr-python; every (well, field,
                        channel, time point) of ZARR has one. Prints
                        "ZARR INPUT ORACLE OK <n>".
"""

import json
import os
import re
import sys

import numpy as np
import tifffile
import zarr
from numcodecs import Blosc
from ome_zarr.format import FormatV04, FormatV05
from ome_zarr.io import parse_url
from ome_zarr.writer import write_image, write_plate_metadata, write_well_metadata


def plate(path, fmt, rows, cols, wells, fields, make, **image_kw):
    store = parse_url(path, mode="w", fmt=fmt).store
    root = zarr.group(store=store, zarr_format=2 if fmt.version == "0.4" else 3)
    write_plate_metadata(root, rows, cols, wells, fmt=fmt, field_count=fields, name=os.path.basename(path))
    for w, well_path in enumerate(wells):
        r, c = well_path.split("/")
        well = root.require_group(r).require_group(c)
        write_well_metadata(well, [{"path": str(f)} for f in range(fields)], fmt=fmt)
        for f in range(fields):
            write_image(make(w, f), well.require_group(str(f)), fmt=fmt, **image_kw)
    return root


def rng_data(seed, shape, dtype):
    return np.random.default_rng(seed).integers(0, np.iinfo(dtype).max, size=shape, dtype=dtype)


def write(out):
    os.makedirs(out, exist_ok=True)
    um = {"z": "micrometer", "y": "micrometer", "x": "micrometer"}
    p04 = os.path.join(out, "p04_blosc.zarr")
    plate(
        p04, FormatV04(), ["A", "B"], ["1", "2"], ["A/1", "B/2"], 2,
        lambda w, f: rng_data(10 * w + f, (2, 3, 24, 20), np.uint16),
        axes="czyx", scale_factors=(2,), scale={"z": 2.0, "y": 0.5, "x": 0.5}, axes_units=um,
        storage_options={"compressor": Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE)},
        omero={"channels": [{"label": n, "color": col, "window": {"min": 0, "max": 65535, "start": 0, "end": 65535}} for n, col in [("DAPI", "0000FF"), ("GFP", "00FF00")]]},
    )
    # Field f at x = 100 + 10 f micrometers (one field width: 20 px x 0.5), y = 50.
    for well in ["A/1", "B/2"]:
        for f in range(2):
            group = zarr.open_group(os.path.join(p04, well, str(f)), mode="r+")
            ms = group.attrs["multiscales"]
            for ds in ms[0]["datasets"]:
                for t in ds["coordinateTransformations"]:
                    if t["type"] == "translation":
                        t["translation"] = [0.0, 0.0, t["translation"][2] + 50.0, t["translation"][3] + 100.0 + 10.0 * f]
            group.attrs["multiscales"] = ms
    p05 = os.path.join(out, "p05.zarr")
    plate(
        p05, FormatV05(), ["A"], ["1", "2"], ["A/1", "A/2"], 1,
        lambda w, f: rng_data(100 + w, (2, 1, 2, 16, 16), np.uint8),
        axes="tczyx", scale_factors=(2,),
    )
    expected = {
        "p04_blosc.zarr": {"wells": ["A01", "B02"], "sites": 2, "channels": 2, "z": 3, "t": 1, "names": ["DAPI", "GFP"],
                           "size": [24, 20], "dtype": "u16", "pixel_size_um": 0.5, "stage_x": [100.0, 110.0], "stage_y": [50.0, 50.0]},
        "p05.zarr": {"wells": ["A01", "A02"], "sites": 1, "channels": 1, "z": 2, "t": 2, "names": [],
                     "size": [16, 16], "dtype": "u8", "pixel_size_um": None, "stage_x": [], "stage_y": []},
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print("written", p04, p05)


NAME = re.compile(r"^([A-Z]+)(\d+)_s(\d+)_w(\d+)_z(\d+)_t(\d+)\.tif$")


def check(root_path, tiffs):
    root = zarr.open_group(root_path, mode="r")
    attrs = root.attrs.asdict()
    ngff = attrs.get("ome", attrs)
    wells = [w["path"] for w in ngff["plate"]["wells"]]
    seen = set()
    for dirpath, _, files in os.walk(tiffs):
        for name in files:
            m = NAME.match(name)
            if not m:
                continue
            row, col, site, c, _z, t = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)), int(m.group(6))
            well = f"{row}/{col}"
            assert well in wells, f"{name}: no well {well} in {wells}"
            field = zarr.open_group(os.path.join(root_path, well), mode="r")
            fattrs = field.attrs.asdict()
            images = fattrs.get("ome", fattrs)["well"]["images"]
            image = zarr.open_group(os.path.join(root_path, well, images[site - 1]["path"]), mode="r")
            iattrs = image.attrs.asdict()
            ms = iattrs.get("ome", iattrs)["multiscales"][0]
            axes = [a["name"] if isinstance(a, dict) else a for a in ms["axes"]]
            data = np.asarray(image[ms["datasets"][0]["path"]][...])
            index = []
            for a in axes[:-2]:
                index.append({"t": t - 1, "c": c - 1, "z": slice(None)}[a])
            planes = data[tuple(index)]
            expected = planes.max(axis=0) if "z" in axes else planes
            got = tifffile.imread(os.path.join(dirpath, name))
            assert got.dtype == expected.dtype, f"{name}: {got.dtype} != {expected.dtype}"
            assert got.shape == expected.shape, f"{name}: {got.shape} != {expected.shape}"
            assert np.array_equal(got, expected), f"{name}: {np.count_nonzero(got != expected)} pixels differ"
            seen.add((well, site, c, t))
    want = set()
    for well in wells:
        field = zarr.open_group(os.path.join(root_path, well), mode="r")
        fattrs = field.attrs.asdict()
        for k, img in enumerate(fattrs.get("ome", fattrs)["well"]["images"]):
            image = zarr.open_group(os.path.join(root_path, well, img["path"]), mode="r")
            iattrs = image.attrs.asdict()
            ms = iattrs.get("ome", iattrs)["multiscales"][0]
            axes = [a["name"] if isinstance(a, dict) else a for a in ms["axes"]]
            shape = image[ms["datasets"][0]["path"]].shape
            size = {a: n for a, n in zip(axes, shape)}
            for c in range(size.get("c", 1)):
                for t in range(size.get("t", 1)):
                    want.add((well, k + 1, c + 1, t + 1))
    assert seen == want, f"outputs {sorted(seen)} != planes {sorted(want)}"
    print("ZARR INPUT ORACLE OK", len(seen))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    elif sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown mode {sys.argv[1]}")
