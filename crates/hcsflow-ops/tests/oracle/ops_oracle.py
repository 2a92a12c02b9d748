"""Reference computations for hcsflow-ops tests (numpy / scipy / scikit-image).

Usage: python3 ops_oracle.py JOBS.json
JOBS.json is a list of {"op", "inputs": [{"path", "dtype", "shape"}], "args", "output"}.
Each input is raw little-endian pixels; each result is written to "output" as
raw float64, and the list of result shapes is printed as JSON on stdout.
Only library calls users trust are used here: this file is the reference.
"""
import json
import sys

import numpy as np

DTYPES = {"u8": np.uint8, "u16": np.uint16, "f32": np.float32}


def load(spec):
    return np.fromfile(spec["path"], dtype=DTYPES[spec["dtype"]]).reshape(spec["shape"])


def percentile_normalize(a, low_percentile, high_percentile, target_min, target_max):
    """OpenHCS's formula in float64, rounded to nearest like hcsflow's dtype policy."""
    lo, hi = np.percentile(a, (low_percentile, high_percentile))
    if hi == lo:
        return np.full(a.shape, target_min, np.float64)
    c = np.clip(a.astype(np.float64), lo, hi)
    return (c - lo) * (target_max - target_min) / (hi - lo) + target_min


def op_percentiles(a, q):
    if a.dtype == np.float32:
        return np.nanpercentile(a, q)
    return np.percentile(a, q)


def equalize_hist(a, nbins=256):
    from skimage import exposure
    return exposure.equalize_hist(a, nbins=nbins)


def per_plane(f):
    return lambda a, **k: np.stack([f(p, **k) for p in a])


def gaussian(p, sigma_y, sigma_x, truncate):
    from scipy import ndimage as ndi
    return ndi.gaussian_filter(p.astype(np.float64), (sigma_y, sigma_x), mode="reflect", truncate=truncate)


def unsharp(p, radius, amount):
    from skimage import filters
    return filters.unsharp_mask(p.astype(np.float64), radius=radius, amount=amount, preserve_range=True)


def median(p, size):
    from scipy import ndimage as ndi
    return ndi.median_filter(p, size=size, mode="reflect")


def sobel(p):
    from skimage import filters
    return filters.sobel(p.astype(np.float64))


def clahe(p, kernel_size=None, clip_limit=0.01, nbins=256):
    """equalize_adapthist, delivered in the input dtype as hcsflow documents it:
    img_as_ubyte / img_as_uint of the float result for integers; f32 planes outside
    [-1, 1] (rejected by skimage) are first stretched to [0, 1] by rescale_intensity."""
    from skimage import exposure, util
    if p.dtype == np.float32 and (p.min() < -1 or p.max() > 1):
        p = exposure.rescale_intensity(p, out_range=(0, 1))
    res = exposure.equalize_adapthist(p, kernel_size=kernel_size, clip_limit=clip_limit, nbins=nbins)
    if p.dtype == np.uint8:
        return util.img_as_ubyte(res)
    if p.dtype == np.uint16:
        return util.img_as_uint(res)
    return res


def binning(a, factor, mode):
    n, h, w = a.shape
    b = a[:, : h // factor * factor, : w // factor * factor].astype(np.float64)
    b = b.reshape(n, h // factor, factor, w // factor, factor)
    return b.mean(axis=(2, 4)) if mode == "mean" else b.sum(axis=(2, 4))


def composite(a, weights):
    w = np.ones(a.shape[0]) if not weights else np.asarray(weights, np.float64)
    return np.tensordot(w / w.sum(), a.astype(np.float64), 1)


def apply_mask(a, mask_index, fill):
    m = a[mask_index]
    rest = np.delete(a, mask_index % a.shape[0], axis=0)
    return np.where(m != 0, rest, fill)


def image_quality(a, saturation=None):
    """Per plane: mean, std, min, max, var(laplace(p / mean)) over the interior,
    % of pixels at `saturation`, % zero (float64, scipy.ndimage.laplace)."""
    rows = []
    for p in a.astype(np.float64):
        mean = p.mean()
        if mean != 0 and min(p.shape) >= 3:
            from scipy import ndimage as ndi

            focus = ndi.laplace(p / mean)[1:-1, 1:-1].var()
        else:
            focus = 0.0
        saturated = 0.0 if saturation is None else (p == saturation).mean() * 100
        rows.append([mean, p.std(), p.min(), p.max(), focus, saturated, (p == 0).mean() * 100])
    return np.array(rows)


OPS = {
    "max": lambda a: a.max(axis=0),
    "min": lambda a: a.min(axis=0),
    "mean": lambda a: a.mean(axis=0, dtype=np.float64),
    "sum": lambda a: a.sum(axis=0, dtype=np.float64),
    "std": lambda a: a.std(axis=0, dtype=np.float64),
    "percentiles": lambda a, q: op_percentiles(a, q),
    "percentile_normalize_stack": lambda a, **k: percentile_normalize(a, **k),
    "equalize_hist": equalize_hist,
    "gaussian": per_plane(gaussian),
    "unsharp": per_plane(unsharp),
    "median": per_plane(median),
    "sobel": per_plane(sobel),
    "clahe": per_plane(clahe),
    "bin": binning,
    "crop": lambda a, y, x, height, width: a[:, y : y + height, x : x + width],
    "composite": composite,
    "apply_mask": apply_mask,
    "image_quality": image_quality,
    "percentile_normalize_slices": lambda a, **k: np.stack([percentile_normalize(p, **k) for p in a]),
}


def run_job(job):
    arrays = [load(s) for s in job["inputs"]]
    op = OPS[job["op"]]
    res = np.asarray(op(*arrays, **job.get("args", {})), dtype=np.float64)
    np.ascontiguousarray(res).tofile(job["output"])
    return list(res.shape)


def main():
    with open(sys.argv[1]) as fh:
        jobs = json.load(fh)
    shapes = [run_job(j) for j in jobs]
    json.dump(shapes, sys.stdout)


if __name__ == "__main__":
    main()
