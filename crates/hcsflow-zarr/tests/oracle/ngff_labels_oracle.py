#!/usr/bin/env python3
"""Independent check of the NGFF label images of an hcsflow OME-Zarr plate with
ome-zarr-py (napari's OME-Zarr reader), zarr-python and ome-zarr-models.

usage: ngff_labels_oracle.py PLATE_ROOT EXPECTED_DIR

EXPECTED_DIR/labels.json (written by the Rust test) says, per field image path
(e.g. "A/1/0"), the label names that must be listed, the NGFF version, the
number of pyramid levels and the level-0 shape [t, 1, z, y, x]. For every
(field, label), EXPECTED_DIR/<row>_<col>_<field>_<label>.bin holds the
expected level-0 label values (u16 little-endian, C order, [t, 1, z, y, x]).
Level k must be level 0 subsampled by 2^k in y and x (nearest: [::2^k, ::2^k],
what the writer documents; labels are never averaged).

Prints one line per check and `ORACLE OK ...` at the end; exits 1 listing the
failures otherwise.
"""
import json
import sys
from pathlib import Path

import numpy as np
import zarr
from ome_zarr.io import parse_url
from ome_zarr.reader import Label, Labels, Multiscales, Reader

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL {what}")
    return cond


def expected_level0(exp_dir, field_path, label, shape):
    row, col, field = field_path.split("/")
    raw = (exp_dir / f"{row}_{col}_{field}_{label}.bin").read_bytes()
    return np.frombuffer(raw, dtype="<u2").reshape(shape)


def with_ome_zarr(root, exp, exp_dir):
    """napari's path: read the field image; its labels group and label images follow."""
    for field_path, names in exp["fields"].items():
        nodes = list(Reader(parse_url(str(root / field_path)))())
        image = nodes[0] if nodes else None
        check(image is not None and image.load(Multiscales) is not None, f"ome-zarr: {field_path} is a multiscale image")
        groups = [n for n in nodes if n.load(Labels) is not None]
        check(len(groups) == 1, f"ome-zarr: {field_path} has one labels group (found {len(groups)})")
        labels = {n.metadata.get("name"): n for n in nodes if n.load(Label) is not None}
        check(sorted(labels) == sorted(names), f"ome-zarr: {field_path} labels {sorted(labels)} != {sorted(names)}")
        for name in names:
            node = labels.get(name)
            if node is None:
                continue
            check(node.load(Multiscales) is not None, f"ome-zarr: {field_path} label {name} is a multiscale")
            check(len(node.data) == exp["levels"], f"ome-zarr: {field_path}/{name} levels {len(node.data)}")
            want0 = expected_level0(exp_dir, field_path, name, exp["shape"])
            image_transforms = image.metadata.get("coordinateTransformations")
            check(node.metadata.get("coordinateTransformations") == image_transforms,
                  f"ome-zarr: {field_path}/{name} transforms equal the image's")
            for level, data in enumerate(node.data):
                arr = np.asarray(data)
                step = 2 ** level
                want = want0[..., ::step, ::step]
                check(np.issubdtype(arr.dtype, np.integer), f"ome-zarr: {field_path}/{name}/{level} dtype {arr.dtype}")
                ok = check(arr.shape == want.shape, f"ome-zarr: {field_path}/{name}/{level} shape {arr.shape} != {want.shape}")
                same = ok and check(np.array_equal(arr, want), f"ome-zarr: {field_path}/{name}/{level} values")
                if level == 0:
                    print(f"ome-zarr: {field_path} label {name}: shape={arr.shape} dtype={arr.dtype} "
                          f"objects={len(np.unique(arr)) - 1} values={'ok' if same else 'MISMATCH'}")
            # The image-label source leads back to the field image (the reader prepends it).
            check(any(n.zarr.path.rstrip("/").endswith(field_path) for n in nodes if n.load(Multiscales) and not n.load(Label)),
                  f"ome-zarr: {field_path}/{name} source image found")


def with_zarr_and_models(root, exp):
    version = exp["version"]
    zarr_format = 3 if version == "0.5" else 2
    if version == "0.5":
        from ome_zarr_models.v05.image import Image
    else:
        from ome_zarr_models.v04.image import Image
    for field_path, names in exp["fields"].items():
        group = zarr.open_group(str(root / field_path), mode="r", zarr_format=zarr_format)
        attrs = dict(group["labels"].attrs)
        listed = attrs["ome"]["labels"] if version == "0.5" else attrs.get("labels")
        check(sorted(listed or []) == sorted(names), f"zarr: {field_path}/labels lists {listed}")
        for name in names:
            arr = group[f"labels/{name}/0"]
            check(arr.dtype == np.dtype("uint16"), f"zarr: {field_path}/labels/{name}/0 dtype {arr.dtype}")
        try:
            image = Image.from_zarr(group)
            labels = image.labels
            # v05 models list them as label_paths, v04 as the group's attributes.
            paths = getattr(labels, "label_paths", None) if labels is not None else []
            if paths is None:
                paths = labels.attributes.labels
            found = sorted(paths)
            check(found == sorted(names), f"ome-zarr-models: {field_path} labels {found}")
            print(f"ome-zarr-models: {field_path} is a valid NGFF {version} image with labels {found}")
        except Exception as e:  # any validation error is a failure with its message
            check(False, f"ome-zarr-models: {field_path} {version} validation: {type(e).__name__}: {e}")


def main():
    root, exp_dir = Path(sys.argv[1]), Path(sys.argv[2])
    exp = json.loads((exp_dir / "labels.json").read_text())
    with_ome_zarr(root, exp, exp_dir)
    with_zarr_and_models(root, exp)
    if failures:
        print(f"ORACLE FAILED: {len(failures)} check(s)")
        sys.exit(1)
    print(f"ORACLE OK: NGFF {exp['version']} labels of {len(exp['fields'])} fields")


if __name__ == "__main__":
    main()
