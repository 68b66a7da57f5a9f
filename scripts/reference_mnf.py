#!/usr/bin/env python3
"""PyTorch reference of the MNF that `hypermnf bench gpu` times, written for speed.

Same work, same shapes: an int16 cube of (1087·scale) × 614 × 224 in page-locked host memory, k = 10,
mean-filter noise (x − mean of the 8 neighbours, interior pixels, covariance / (9/8)), data covariance
centred on the band means, the generalized eigenproblem C_D w = λ C_N w through the Cholesky factor of
C_N in float64 on the device, Z = (X − μ) W_k in float32, copied into a page-locked float32 host buffer.
The int16 data go over PCIe as int16 and are converted on the device; matrix products are float32
(TF32 off), as in hypermnf. Prints one markdown table row per scale, like `hypermnf bench gpu`.

The cube is synthetic (a smooth low-rank signal plus white noise, like hypermnf's generator); timings do
not depend on the values.
"""
import argparse
import statistics
import time

import torch


def make_cube(lines, samples, bands, seed=42):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dims = 5
    l = torch.arange(lines, device="cuda", dtype=torch.float32)[:, None, None]
    s = torch.arange(samples, device="cuda", dtype=torch.float32)[None, :, None]
    spectra = torch.rand(dims, bands, device="cuda", generator=g)
    x = torch.full((lines, samples, bands), 1000.0, device="cuda")
    for j in range(dims):
        fl, fs, ph = (torch.rand(3, device="cuda", generator=g) - 0.5) / 40.0
        a = 400.0 * torch.sin(6.2832 * (fl * l + fs * s) + ph * 100.0)
        x += a * spectra[j][None, None, :]
    x += 10.0 * torch.randn(x.shape, device="cuda", generator=g)
    host = torch.empty((lines, samples, bands), dtype=torch.int16, pin_memory=True)
    host.copy_(x.round().clamp(-32768, 32767).to(torch.int16).cpu())
    del x
    torch.cuda.empty_cache()
    return host


def mnf(host_int16, k, out_pinned):
    dev = torch.device("cuda")
    x = host_int16.to(dev, non_blocking=True).to(torch.float32)  # (H, W, B), converted on the device
    h, w, b = x.shape
    # Noise: x − mean of the 8 neighbours at interior pixels.
    nb = (x[:-2, :-2] + x[:-2, 1:-1] + x[:-2, 2:] + x[1:-1, :-2] + x[1:-1, 2:]
          + x[2:, :-2] + x[2:, 1:-1] + x[2:, 2:])
    r = (x[1:-1, 1:-1] - nb * 0.125).reshape(-1, b)
    del nb
    r = r - r.mean(0)
    cn = (r.T @ r).double() / ((r.shape[0] - 1) * 9.0 / 8.0)
    del r
    xf = x.reshape(-1, b)
    mu = xf.mean(0)
    xc = xf - mu
    cd = (xc.T @ xc).double() / (xf.shape[0] - 1)
    # C_D w = λ C_N w via C_N = L Lᵀ, in float64 on the device.
    lchol = torch.linalg.cholesky(cn)
    y = torch.linalg.solve_triangular(lchol, cd, upper=False)
    a = torch.linalg.solve_triangular(lchol, y.T, upper=False)
    a = 0.5 * (a + a.T)
    evals, v = torch.linalg.eigh(a)
    evals, v = evals.flip(0), v.flip(1)
    wmat = torch.linalg.solve_triangular(lchol.T, v, upper=True)
    z = xc @ wmat[:, :k].to(torch.float32)
    out_pinned.copy_(z.reshape(h, w, k), non_blocking=True)
    torch.cuda.synchronize()
    return evals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scales", default="1,4,16")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--k", type=int, default=10)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"\ntorch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print("| scale | lines | what | median ms | min ms | runs |")
    print("|---|---|---|---|---|---|")
    for scale in [int(s) for s in args.scales.split(",")]:
        lines, samples, bands = 1087 * scale, 614, 224
        host = make_cube(lines, samples, bands)
        out = torch.empty((lines, samples, args.k), dtype=torch.float32, pin_memory=True)
        for _ in range(args.warmup):
            mnf(host, args.k, out)
        times = []
        for _ in range(args.runs):
            torch.cuda.synchronize()
            t = time.perf_counter()
            mnf(host, args.k, out)
            times.append((time.perf_counter() - t) * 1e3)
        # The PCIe floor as PyTorch sees it: the pinned int16 cube to the device alone.
        dst = torch.empty(host.shape, dtype=torch.int16, device="cuda")
        pcie = []
        for _ in range(args.runs):
            torch.cuda.synchronize()
            t = time.perf_counter()
            dst.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            pcie.append((time.perf_counter() - t) * 1e3)
        del dst
        print(f"| {scale}x | {lines} | pytorch reference (pinned int16 in, fp32, pinned out) | "
              f"{statistics.median(times):.2f} | {min(times):.2f} | {args.runs} |")
        print(f"| {scale}x | {lines} | pytorch: pinned int16 H2D only | "
              f"{statistics.median(pcie):.2f} | {min(pcie):.2f} | {args.runs} |")
        del host, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
