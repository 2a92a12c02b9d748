"""Float64 NumPy references of the N2V2 U-Net layers (the oracle of tests/it/layers.rs).

Reads a JSON case file (argv[1]) and prints JSON with each layer's output, flattened row-major:
  conv:     x [B,C,H,W], w [O,C,k,k], b [O]  -> zero padding k//2, stride 1
  pool:     x [B,C,H,W]                      -> 2x2 max stride 1, then [1 2 1]^T[1 2 1]/16 blur,
                                                zero padding 1, stride 2, per channel
  upsample: x [B,C,H,W]                      -> bilinear x2, half-pixel centres (PyTorch
                                                align_corners=False)
  norm:     x [B,C,H,W], gamma, beta, eps, momentum -> batch statistics (biased variance), and
                                                the running statistics after one update from
                                                mean 0 / var 1, applied in inference mode
Written from the definitions, independent of the Rust code.
"""
import json
import sys

import numpy as np


def arr(case, name):
    return np.asarray(case[name], dtype=np.float64).reshape(case[name + "_shape"])


def conv(x, w, b):
    B, C, H, W = x.shape
    O, _, k, _ = w.shape
    p = k // 2
    xp = np.zeros((B, C, H + 2 * p, W + 2 * p))
    xp[:, :, p:p + H, p:p + W] = x
    out = np.zeros((B, O, H, W))
    for dy in range(k):
        for dx in range(k):
            out += np.einsum("bchw,oc->bohw", xp[:, :, dy:dy + H, dx:dx + W], w[:, :, dy, dx])
    return out + b[None, :, None, None]


def pool(x):
    B, C, H, W = x.shape
    m = np.maximum.reduce([x[:, :, :-1, :-1], x[:, :, 1:, :-1], x[:, :, :-1, 1:], x[:, :, 1:, 1:]])
    h, w = m.shape[2], m.shape[3]
    mp = np.zeros((B, C, h + 2, w + 2))
    mp[:, :, 1:-1, 1:-1] = m
    k1 = np.array([1.0, 2.0, 1.0])
    k = np.outer(k1, k1) / 16.0
    oh, ow = (h + 2 - 3) // 2 + 1, (w + 2 - 3) // 2 + 1
    out = np.zeros((B, C, oh, ow))
    for a in range(3):
        for c in range(3):
            out += k[a, c] * mp[:, :, a:a + 2 * oh:2, c:c + 2 * ow:2]
    return out


def upsample(x):
    def axis(n):
        src = (np.arange(2 * n) + 0.5) / 2.0 - 0.5
        src = np.maximum(src, 0.0)
        i0 = np.floor(src).astype(int)
        i1 = np.minimum(i0 + 1, n - 1)
        return i0, i1, src - i0

    B, C, H, W = x.shape
    y0, y1, ly = axis(H)
    x0, x1, lx = axis(W)
    top = x[:, :, y0, :] * (1 - ly)[None, None, :, None] + x[:, :, y1, :] * ly[None, None, :, None]
    return top[:, :, :, x0] * (1 - lx) + top[:, :, :, x1] * lx


def norm(x, gamma, beta, eps, momentum):
    mean = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))
    g, b = gamma[None, :, None, None], beta[None, :, None, None]
    train = (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + eps) * g + b
    rm = (1 - momentum) * 0.0 + momentum * mean
    rv = (1 - momentum) * 1.0 + momentum * var
    infer = (x - rm[None, :, None, None]) / np.sqrt(rv[None, :, None, None] + eps) * g + b
    return train, infer


def main():
    with open(sys.argv[1]) as fh:
        case = json.load(fh)
    x = arr(case, "x")
    out = {
        "conv3": conv(x, arr(case, "w3"), arr(case, "b3")).ravel().tolist(),
        "conv1": conv(x, arr(case, "w1"), arr(case, "b1")).ravel().tolist(),
        "pool": pool(x).ravel().tolist(),
        "upsample": upsample(x).ravel().tolist(),
    }
    train, infer = norm(x, arr(case, "gamma"), arr(case, "beta"), case["eps"], case["momentum"])
    out["norm_train"] = train.ravel().tolist()
    out["norm_infer"] = infer.ravel().tolist()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
