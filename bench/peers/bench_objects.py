"""scipy / scikit-image timings of nuclei segmentation and object measurement on the
peer bench's 2048² cells image, for scripts/bench-vs-peers.sh (same protocol as
../shared/bench/bench_skimage.py: `--op NAME` prints one JSON line with the timing
and peak RSS; `--list`). Needs the peer bench's common.py on PYTHONPATH.

The derived inputs (nuclei mask, watershed inputs, label image) are made in
each op's setup, not timed, by the helpers below, which scripts/bench_peers.py
also calls to write the same inputs for hcsflow's side:
- mask: gaussian σ 1.5 (scipy, reflect) > Otsu of the smoothed image, holes filled;
- watershed inputs: −EDT of the mask (float32), markers = label(peak_local_max
  of the EDT smoothed with σ 1, min_distance 4, within the mask), the mask;
- labels: skimage.segmentation.watershed of those, then remove_small_objects(< 30 px).
"""
import argparse
import json
import os
import sys

import numpy as np

import common  # the peer bench's common.py (PYTHONPATH)

OPS = {}


def op(name, repeats=3, needs="img"):
    def deco(f):
        OPS[name] = (f, repeats, needs)
        return f
    return deco


def nuclei_mask(img):
    from scipy import ndimage as ndi
    from skimage.filters import threshold_otsu
    s = ndi.gaussian_filter(img.astype(np.float32), 1.5)
    return ndi.binary_fill_holes(s > threshold_otsu(s))


def watershed_inputs(img):
    """(−distance as float32, int32 markers, bool mask)."""
    from scipy import ndimage as ndi
    from skimage.feature import peak_local_max
    mask = nuclei_mask(img)
    dist = ndi.distance_transform_edt(mask).astype(np.float32)
    smooth = np.where(mask, ndi.gaussian_filter(dist, 1.0), 0)
    peaks = peak_local_max(smooth, min_distance=4, labels=mask.astype(np.int32), exclude_border=False)
    seeds = np.zeros(mask.shape, bool)
    seeds[tuple(peaks.T)] = True
    markers, _ = ndi.label(seeds, structure=np.ones((3, 3)))
    return -dist, markers.astype(np.int32), mask


def nuclei_labels(img):
    from skimage import morphology, segmentation
    neg, markers, mask = watershed_inputs(img)
    labels = segmentation.watershed(neg, markers, connectivity=2, mask=mask)
    return morphology.remove_small_objects(labels, max_size=29)


@op("scipy_distance_transform_edt_2048", repeats=5)
def _(img):
    from scipy import ndimage as ndi
    mask = nuclei_mask(img)
    return lambda: ndi.distance_transform_edt(mask)


@op("skimage_watershed_2048")
def _(img):
    from skimage import segmentation
    neg, markers, mask = watershed_inputs(img)
    return lambda: segmentation.watershed(neg, markers, connectivity=2, mask=mask)


@op("skimage_nuclei_segmentation_2048")
def _(img):
    """The whole chain segment_nuclei runs: smooth, Otsu, fill holes, EDT, smoothed-EDT
    maxima, watershed, size filter."""
    return lambda: nuclei_labels(img)


@op("skimage_regionprops_table_2048")
def _(img):
    from skimage import measure
    labels = nuclei_labels(img)
    props = ("label", "area", "centroid", "bbox", "perimeter", "eccentricity", "axis_major_length",
             "axis_minor_length", "area_convex", "solidity", "intensity_mean", "intensity_min", "intensity_max")

    def run():
        t = measure.regionprops_table(labels, intensity_image=img, properties=props)
        run.n = len(t["label"])
        return t
    run.n = 0
    return run


@op("skimage_colocalization_2ch_2048")
def _(img):
    """Per image: the four skimage.measure coefficients of two channels (the cells
    image and a second channel made from it), with the fixed thresholds COLOC_THRESHOLDS
    (our side gets the same as threshold_method=manual)."""
    from skimage import measure
    a, b = coloc_channels(img)
    ta, tb = COLOC_THRESHOLDS

    def run():
        return (measure.pearson_corr_coeff(a, b)[0], measure.manders_coloc_coeff(a, b > tb),
                measure.manders_coloc_coeff(b, a > ta), measure.manders_overlap_coeff(a, b),
                measure.intersection_coeff(a > ta, b > tb), measure.intersection_coeff(b > tb, a > ta))
    return run


# Channel thresholds of the colocalisation op (the cells image's background is ~300).
COLOC_THRESHOLDS = (1000.0, 500.0)


def coloc_channels(img):
    """Channel A = the cells image; channel B = it shifted by 3 px in x, halved, plus a ramp (u16)."""
    b = np.roll(img, 3, axis=1) // 2 + (np.arange(img.shape[1], dtype=np.uint16)[None, :] // 16)
    return img, b.astype(img.dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list or not a.op:
        print("\n".join(OPS))
        return
    f, repeats, _needs = OPS[a.op]
    fn = f(common.cells_image())
    before = common.peak_rss_mib()
    t = common.bench(fn, repeats=repeats)
    extra = {"note": f"objects={fn.n}"} if hasattr(fn, "n") else {}
    common.report(a.op, t, before, **extra)


if __name__ == "__main__":
    sys.exit(main())
