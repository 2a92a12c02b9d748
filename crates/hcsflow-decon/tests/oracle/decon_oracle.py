"""References for hcsflow-decon's tests (float64 throughout, results saved as float32 .npy).

    skimage IMAGE PSF OUT ITER      scikit-image richardson_lucy(clip=False) (the "same" boundary)
    circular IMAGE PSF OUT ITER     Richardson-Lucy with circular convolution, written here with NumPy FFTs:
                                    OTF = rfftn of the PSF with its centre voxel rolled to index 0, adjoint conj(OTF),
                                    initial estimate 0.5, denominator max(blur, 1e-12)
    blur TRUTH PSF OUT SEED         scipy.signal.fftconvolve(truth, psf, mode="same"), then Poisson noise
                                    (numpy default_rng(SEED)); the truth is in expected photon counts
"""
import sys

import numpy as np


def load(path):
    return np.load(path).astype(np.float64)


def save(path, a):
    np.save(path, np.ascontiguousarray(a, dtype=np.float32))


def skimage_rl(image, psf, it):
    from skimage.restoration import richardson_lucy

    return richardson_lucy(image, psf, num_iter=it, clip=False)


def circular_rl(image, psf, it):
    pad = np.zeros(image.shape)
    pad[tuple(slice(0, s) for s in psf.shape)] = psf
    pad = np.roll(pad, [-((s - 1) // 2) for s in psf.shape], axis=tuple(range(psf.ndim)))
    otf = np.fft.rfftn(pad)
    est = np.full(image.shape, 0.5)
    for _ in range(it):
        blur = np.fft.irfftn(np.fft.rfftn(est) * otf, s=image.shape, axes=tuple(range(image.ndim)))
        ratio = image / np.maximum(blur, 1e-12)
        est = est * np.fft.irfftn(np.fft.rfftn(ratio) * np.conj(otf), s=image.shape, axes=tuple(range(image.ndim)))
    return est


def main():
    cmd = sys.argv[1]
    if cmd in ("skimage", "circular"):
        image, psf, out, it = load(sys.argv[2]), load(sys.argv[3]), sys.argv[4], int(sys.argv[5])
        psf = psf / psf.sum()
        save(out, (skimage_rl if cmd == "skimage" else circular_rl)(image, psf, it))
    elif cmd == "blur":
        from scipy.signal import fftconvolve

        truth, psf, out, seed = load(sys.argv[2]), load(sys.argv[3]), sys.argv[4], int(sys.argv[5])
        blurred = np.clip(fftconvolve(truth, psf / psf.sum(), mode="same"), 0, None)
        save(out, np.random.default_rng(seed).poisson(blurred))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
