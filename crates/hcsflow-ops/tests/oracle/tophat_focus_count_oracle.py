"""Reference computations for the top-hat, focus, threshold, label and count
tests of hcsflow-ops (top-hat, focus stacking, thresholds, labelling,
blob_log), using numpy / scipy / scikit-image.

Usage: python3 tophat_focus_count_oracle.py JOBS.json
JOBS.json is a list of {"op", "inputs": [{"path", "dtype", "shape"}], "args", "output"}.
Inputs are raw little-endian pixels. Each result is written to "output" as raw
float64; the list of result shapes is printed as JSON on stdout.
Only library calls users trust (plus plain numpy arithmetic where the
definition is ours, e.g. the block-mean top-hat) are used: this file is the reference.
"""
import json
import sys

import numpy as np
from scipy import ndimage as ndi
from skimage import feature, filters, measure, morphology

DTYPES = {"u8": np.uint8, "u16": np.uint16, "f32": np.float32}


def load(spec):
    return np.fromfile(spec["path"], dtype=DTYPES[spec["dtype"]]).reshape(spec["shape"])


def white_tophat(a, radius, mode="reflect"):
    """skimage's white_tophat; mode="ignore" only where the disk is much larger than
    the image (there scipy's reflect padding returns values not in the image)."""
    fp = morphology.disk(radius)
    return np.stack([morphology.white_tophat(p, fp, mode=mode) for p in a])


def tophat_fast(a, radius, downsample, mode="reflect"):
    """hcsflow's documented definition of OpenHCS's fast top-hat, in float64."""
    f = downsample
    out = []
    for p in a:
        h, w = p.shape
        hs, ws = -(-h // f), -(-w // f)
        pad = np.full((hs * f, ws * f), np.nan)
        pad[:h, :w] = p
        small = np.nanmean(pad.reshape(hs, f, ws, f), axis=(1, 3)).astype(np.float32)
        bg = morphology.opening(small, morphology.disk(radius // f), mode=mode).astype(np.float64)

        def coords(n, m):
            s = np.clip((np.arange(n) + 0.5) / f - 0.5, 0, m - 1)
            i0 = np.floor(s).astype(int)
            return i0, np.minimum(i0 + 1, m - 1), s - i0

        y0, y1, fy = coords(h, hs)
        x0, x1, fx = coords(w, ws)
        top = (1 - fx) * bg[y0][:, x0] + fx * bg[y0][:, x1]
        bot = (1 - fx) * bg[y1][:, x0] + fx * bg[y1][:, x1]
        b = (1 - fy)[:, None] * top + fy[:, None] * bot
        out.append(np.maximum(p.astype(np.float64) - b, 0))
    return np.stack(out)


def focus_measure_log(a, sigma):
    """|laplace(gaussian_filter(plane, sigma))| per plane (scipy, mode reflect)."""
    return np.stack([np.abs(ndi.laplace(ndi.gaussian_filter(p.astype(np.float64), sigma))) for p in a])


def focus_weights(a, sigma):
    """|plane - gaussian_filter(plane, sigma)| per plane."""
    return np.stack([np.abs(p.astype(np.float64) - ndi.gaussian_filter(p.astype(np.float64), sigma)) for p in a])


def otsu(a):
    return np.array([float(filters.threshold_otsu(p)) for p in a])


def li(a):
    return np.array([float(filters.threshold_li(p)) for p in a])


def label(a, connectivity):
    return np.stack([measure.label(p != 0, connectivity=connectivity, background=0) for p in a]).astype(np.float64)


def ndi_label(a, connectivity):
    st = ndi.generate_binary_structure(2, connectivity)
    return np.stack([ndi.label(p != 0, structure=st)[0] for p in a]).astype(np.float64)


def blob_log(a, min_sigma, max_sigma, num_sigma, threshold, overlap):
    """Rows (y, x, sigma) of plane 0, in skimage's order."""
    b = feature.blob_log(a[0], min_sigma=min_sigma, max_sigma=max_sigma, num_sigma=num_sigma,
                         threshold=threshold, overlap=overlap)
    return np.asarray(b, np.float64).reshape(-1, 3)


def regionprops(a, threshold):
    """label(plane0 > threshold, 8-conn): rows (label, area, cy, cx, mean_intensity)."""
    p = a[0]
    lab = measure.label(p > threshold, connectivity=2)
    rows = [(r.label, r.area, r.centroid[0], r.centroid[1], r.intensity_mean)
            for r in measure.regionprops(lab, intensity_image=p.astype(np.float64))]
    return np.array(rows, np.float64).reshape(-1, 5)


OPS = {
    "white_tophat": white_tophat,
    "tophat_fast": tophat_fast,
    "focus_measure_log": focus_measure_log,
    "focus_weights": focus_weights,
    "otsu": otsu,
    "li": li,
    "label": label,
    "ndi_label": ndi_label,
    "blob_log": blob_log,
    "regionprops": regionprops,
}


def main():
    jobs = json.load(open(sys.argv[1]))
    shapes = []
    for job in jobs:
        arrays = [load(s) for s in job["inputs"]]
        r = np.asarray(OPS[job["op"]](*arrays, **job["args"]), np.float64)
        r.tofile(job["output"])
        shapes.append(list(r.shape))
    print(json.dumps(shapes))


if __name__ == "__main__":
    main()
