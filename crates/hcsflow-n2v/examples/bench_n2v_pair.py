"""Writes bench_n2v.py's benchmark pair (1024^2 synthetic nuclei, Poisson + read noise; the same
function, seed and parameters CAREamics is measured on) as float32 .npy for examples/bench_n2v.rs.

Usage: python bench_n2v_pair.py SHARED_BENCH_DIR OUT_DIR   (writes OUT_DIR/n2v_clean.npy, n2v_noisy.npy)
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.abspath(sys.argv[1]))
import bench_n2v  # noqa: E402  (numpy only at import)

clean, noisy = bench_n2v.noisy_pair()
os.makedirs(sys.argv[2], exist_ok=True)
np.save(os.path.join(sys.argv[2], "n2v_clean.npy"), clean.astype(np.float32))
np.save(os.path.join(sys.argv[2], "n2v_noisy.npy"), noisy.astype(np.float32))
print(f"noisy PSNR {bench_n2v.psnr(clean, noisy):.2f} dB")
