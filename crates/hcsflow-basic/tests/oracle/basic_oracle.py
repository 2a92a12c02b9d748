"""Oracles for hcsflow-basic's tests.

  dct IN OUT            scipy.fft.dctn(x, norm="ortho") of every plane (float64)
  idct IN OUT           scipy.fft.idctn(x, norm="ortho")
  resize IN OUT H W AA  torch.nn.functional.interpolate(bilinear, align_corners=True, antialias=AA)
  fit IN OUT JSON       a float64 NumPy transcription of BaSiCPy 2.0's approximate fit
                        (written for this test from its algorithm) on images already at
                        the working size; OUT gets [flatfield, darkfield] and OUT.baseline.npy
  npz NPZ KEY OUT       an array of an .npz saved as .npy (float32 for the Rust reader)
"""
import json
import sys

import numpy as np


def shrink(x, t):
    return np.sign(x) * np.maximum(np.abs(x) - t, 0)


def fit(im, p):
    from scipy.fft import dctn, idctn

    def dct(x):
        return dctn(x, norm="ortho")

    def idct(x):
        return idctn(x, norm="ortho")

    n, h, w = im.shape
    im = im.astype(np.float64)
    if p.get("smoothness_flatfield") is None:
        m = im.mean(0)
        m = m / m.mean()
        lam_f = np.abs(dct(m)).sum() / 400 * 0.5
    else:
        lam_f = p["smoothness_flatfield"]
    lam_d = p.get("smoothness_darkfield")
    if lam_d is None:
        lam_d = 0.1 * lam_f
    if p.get("sort_intensity", False):
        im = np.sort(im, axis=0)
    dark = p.get("get_darkfield", False)
    flat = im.reshape(n, -1)
    spectral = np.linalg.svd(flat, compute_uv=False)[0]
    mu0 = 12.5 / spectral
    mu_max = mu0 * 1e7
    norm = np.linalg.norm(flat)
    dz_max = im.min()
    max_it = p.get("max_iterations", 500)
    tol = p.get("optimization_tol", 1e-3)
    W = np.ones_like(im)
    last = None
    b0 = im.mean(axis=(1, 2)) / im.mean()
    for _ in range(p.get("max_reweight_iterations", 10)):
        S = np.ones((h, w))
        S_hat = dct(S)
        D_R = np.zeros((h, w))
        D_Z = 0.0
        B = b0.copy()
        I_R = np.zeros_like(im)
        Y = np.zeros_like(im)
        mu = mu0
        k = 0
        ratio = np.inf
        while ratio > tol and k < max_it:
            S = idct(S_hat)
            I_B = S[None] * B[:, None, None] + D_R[None]
            S_hat = shrink(S_hat + dct((im - I_R - I_B + Y / mu).mean(0)), lam_f / mu)
            S = idct(S_hat)
            I_B = S[None] * B[:, None, None] + D_R[None]
            I_R = shrink(I_R + (im - I_B - I_R + Y / mu), W / mu)
            R = im - I_R
            B = np.maximum(R.mean(axis=(1, 2)) / R.mean(), 0)
            I_B = S[None] * B[:, None, None] + D_R[None]
            if dark:
                valid = B < 1
                inm = S >= S.mean()
                outm = ~inm
                b1 = (R[:, inm].mean(1) - R[:, outm].mean(1)) / (R.mean() + 1e-6)
                kv = valid.sum()
                bv = B[valid]
                t1, t2, t3, t4 = (bv ** 2).sum(), bv.sum(), b1[valid].sum(), (bv * b1[valid]).sum()
                t5 = t2 * t3 - kv * t4
                D_Z = 0.0 if t5 == 0 else (t1 * t3 - t2 * t4) / t5
                D_Z = min(max(D_Z, 0), dz_max / S.mean())
                Z = D_Z * S.mean() - D_Z * S
                A1 = R[valid].mean(0) - bv.mean() * S
                A1 = A1 - A1.mean()
                D_R = A1 - A1.mean() - Z
                D_R = idct(shrink(dct(D_R), lam_d / (10 * mu)))
                D_R = shrink(D_R, lam_d / (10 * mu)) + Z
            res = im - I_B - I_R
            Y = Y + mu * res
            mu = min(mu * 1.5, mu_max)
            ratio = np.linalg.norm(res) / norm
            k += 1
        D_R = D_R + D_Z * S
        S = I_B.mean(0) - D_R
        mean_S = S.mean()
        S = S / mean_S
        XE = I_R / (I_B.mean(axis=(1, 2))[:, None, None] + 1e-6)
        W = 1.0 / (np.abs(XE) + 0.1)
        W = W * W.size / W.sum()
        if last is not None and np.abs(S - last).sum() / np.abs(last).sum() <= p.get("reweighting_tol", 1e-2):
            break
        last = S
    return S, D_R, B * mean_S


def main():
    cmd = sys.argv[1]
    if cmd in ("dct", "idct"):
        from scipy.fft import dctn, idctn
        x = np.load(sys.argv[2]).astype(np.float64)
        f = dctn if cmd == "dct" else idctn
        np.save(sys.argv[3], np.stack([f(p, norm="ortho") for p in x]))
    elif cmd == "resize":
        import torch
        import torch.nn.functional as F
        x = torch.from_numpy(np.load(sys.argv[2]).astype(np.float32))
        h, w, aa = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1"
        y = F.interpolate(x[:, None], (h, w), mode="bilinear", align_corners=True, antialias=aa)[:, 0]
        np.save(sys.argv[3], y.numpy())
    elif cmd == "fit":
        im = np.load(sys.argv[2])
        S, D, B = fit(im, json.loads(sys.argv[4]))
        np.save(sys.argv[3], np.stack([S, D]).astype(np.float32))
        np.save(sys.argv[3] + ".baseline.npy", B.astype(np.float32)[None, None])
    elif cmd == "npz":
        np.save(sys.argv[4], np.asarray(np.load(sys.argv[2])[sys.argv[3]], dtype=np.float32))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
