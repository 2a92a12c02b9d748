"""Float64 NumPy forward pass of the whole N2V2 U-Net in inference mode (the oracle of
tests/it/unet.rs), from CAREamics' description (depth 2, MaxBlurPool, no top skip, bilinear
upsampling, 1x1 head), using the layer definitions of oracle_layers.py.

argv[1]: JSON {"x": [...], "x_shape": [B,1,H,W], "params": {path: {"shape": [...], "data": [...]}}}
Prints the output, flattened row-major, as a JSON list.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_layers import conv, pool, upsample  # noqa: E402

EPS = 1e-5


def main():
    with open(sys.argv[1]) as fh:
        case = json.load(fh)
    p = {k: np.asarray(v["data"], dtype=np.float64).reshape(v["shape"]) for k, v in case["params"].items()}

    def bn(x, name):
        m, v = p[name + ".running_mean"], p[name + ".running_var"]
        g, b = p[name + ".gamma"], p[name + ".beta"]
        s = lambda t: t[None, :, None, None]  # noqa: E731
        return (x - s(m)) / np.sqrt(s(v) + EPS) * s(g) + s(b)

    def block(x, name):
        x = np.maximum(bn(conv(x, p[name + ".conv1.weight"], p[name + ".conv1.bias"]), name + ".norm1"), 0)
        return np.maximum(bn(conv(x, p[name + ".conv2.weight"], p[name + ".conv2.bias"]), name + ".norm2"), 0)

    x = np.asarray(case["x"], dtype=np.float64).reshape(case["x_shape"])
    e0 = block(x, "enc0")
    e1 = block(pool(e0), "enc1")
    b = block(pool(e1), "bottleneck")
    d0 = block(np.concatenate([upsample(b), e1], axis=1), "dec0")
    d1 = block(upsample(d0), "dec1")
    out = conv(d1, p["head.weight"], p["head.bias"])
    print(json.dumps(out.ravel().tolist()))


if __name__ == "__main__":
    main()
