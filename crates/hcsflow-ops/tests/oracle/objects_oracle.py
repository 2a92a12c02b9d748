"""Reference computations for the segmentation and object-measurement tests of
hcsflow-ops (distance transform, watershed, hole filling, border clearing,
size filter, regionprops, colocalisation coefficients), using numpy / scipy / scikit-image only.

Usage: python3 objects_oracle.py JOBS.json  (same job format as the other oracles:
raw little-endian inputs, float64 outputs, the list of output shapes on stdout).
"""
import json
import warnings
import sys

import numpy as np
from scipy import ndimage as ndi
from skimage import measure, morphology, segmentation

DTYPES = {"u8": np.uint8, "u16": np.uint16, "f32": np.float32}


def load(spec):
    return np.fromfile(spec["path"], dtype=DTYPES[spec["dtype"]]).reshape(spec["shape"])


def edt(a, sampling):
    return np.stack([ndi.distance_transform_edt(p != 0, sampling=sampling) for p in a])


def watershed(image, markers, mask, connectivity):
    """skimage watershed of plane 0 (image as float64 from the f32 input)."""
    m = None if mask is None else mask[0] != 0
    return segmentation.watershed(image[0].astype(np.float64), markers[0].astype(np.int32),
                                  connectivity=connectivity, mask=m)[None]


def watershed_masked(image, markers, mask, connectivity):
    return watershed(image, markers, mask, connectivity)


def watershed_nomask(image, markers, connectivity):
    return watershed(image, markers, None, connectivity)


def watershed_fifo(image, markers, mask, connectivity):
    """A transcription of our watershed's definition with heapq: a priority flood
    from the marker pixels, each pixel labelled when first pushed, popped by
    (cost, push age), a pixel's cost the larger of its value and the cost of the
    pixel it was reached from; the markers all of age 0 and among themselves in
    raster order (skimage leaves that order to its heap); neighbours in skimage's
    order (N, W, E, S, then NW, NE, SW, SE)."""
    import heapq
    img = image[0].astype(np.float64)
    h, w = img.shape
    inside = np.ones((h, w), bool) if mask is None else mask[0] != 0
    out = np.where(inside, markers[0].astype(np.int64), 0)
    steps = [(-1, 0), (0, -1), (0, 1), (1, 0)]
    if connectivity == 2:
        steps += [(-1, -1), (-1, 1), (1, -1), (1, 1)]
    queue = [(img[y, x], 0, y * w + x) for y, x in zip(*np.nonzero(out))]
    heapq.heapify(queue)
    age = 0
    while queue:
        cost, _, p = heapq.heappop(queue)
        y, x = divmod(p, w)
        for dy, dx in steps:
            yy, xx = y + dy, x + dx
            if 0 <= yy < h and 0 <= xx < w and inside[yy, xx] and out[yy, xx] == 0:
                age += 1
                out[yy, xx] = out[y, x]
                heapq.heappush(queue, (max(img[yy, xx], cost), age, yy * w + xx))
    return out[None]


def watershed_fifo_masked(image, markers, mask, connectivity):
    return watershed_fifo(image, markers, mask, connectivity)


def watershed_fifo_nomask(image, markers, connectivity):
    return watershed_fifo(image, markers, None, connectivity)


def fill_holes(a):
    return np.stack([ndi.binary_fill_holes(p != 0) for p in a])


def clear_border(a):
    return np.stack([segmentation.clear_border(p.astype(np.int64)) for p in a])


def remove_small(a, max_size):
    """remove_small_objects on a label image: objects with area <= max_size removed."""
    return np.stack([morphology.remove_small_objects(p.astype(np.int64), max_size=max_size) for p in a])


def regionprops(labels, image):
    """Rows per object of plane 0, in label order."""
    rows = []
    for r in measure.regionprops(labels[0].astype(np.int64), intensity_image=image[0].astype(np.float64)):
        vals = r.image_intensity[r.image]
        rows.append([r.label, r.area, r.centroid[1], r.centroid[0], r.bbox[1], r.bbox[0], r.bbox[3], r.bbox[2],
                     r.perimeter, r.eccentricity, r.axis_major_length, r.axis_minor_length,
                     r.area_convex, r.solidity,
                     r.intensity_mean, vals.sum(), r.intensity_min, r.intensity_max])
    return np.array(rows, np.float64).reshape(-1, 18)


def coloc(a, b, labels, ta, tb):
    """skimage.measure colocalisation of planes a[0], b[0]: the whole image, then
    each label of labels[0] in order; rows [label, pcc, m1, m2, moc, i_ab, i_ba]."""
    a = a[0].astype(np.float64)
    b = b[0].astype(np.float64)
    lab = labels[0].astype(np.int64)
    rows = []
    regions = [(0, None)] + [(int(v), lab == v) for v in np.unique(lab) if v != 0]
    for v, m in regions:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                pcc = measure.pearson_corr_coeff(a, b, mask=m)[0]
            except ValueError:  # fewer than 2 pixels
                pcc = np.nan
            rows.append([v, pcc,
                         measure.manders_coloc_coeff(a, b > tb, mask=m),
                         measure.manders_coloc_coeff(b, a > ta, mask=m),
                         measure.manders_overlap_coeff(a, b, mask=m),
                         measure.intersection_coeff(a > ta, b > tb, mask=m),
                         measure.intersection_coeff(b > tb, a > ta, mask=m)])
    return np.array(rows, np.float64).reshape(-1, 7)


OPS = {
    "coloc": coloc,
    "edt": edt,
    "watershed_masked": watershed_masked,
    "watershed_fifo_masked": watershed_fifo_masked,
    "watershed_fifo_nomask": watershed_fifo_nomask,
    "watershed_nomask": watershed_nomask,
    "fill_holes": fill_holes,
    "clear_border": clear_border,
    "remove_small": remove_small,
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
