"""Times the MNF eigen step (n = 224, float64) the ways available on the GPU host, to choose where
hypermnf should solve it: host LAPACK (numpy/scipy/torch), cuSOLVER through torch and CuPy.
Run: python3 scripts/dev/eigen-bench.py  (development tool; numbers go to docs/gpu-notes.md)"""
import os, time, statistics as st
import numpy as np

n, k = 224, 10
rng = np.random.default_rng(7)
# An MNF-like pair: C_N well conditioned, C_D = C_N-whitened spectrum with a few large eigenvalues.
q, _ = np.linalg.qr(rng.standard_normal((n, n)))
cn = q @ np.diag(rng.uniform(1, 50, n)) @ q.T
spec = np.concatenate([np.geomspace(1e5, 20, 12), rng.uniform(0.8, 1.3, n - 12)])
l = np.linalg.cholesky(cn)
q2, _ = np.linalg.qr(rng.standard_normal((n, n)))
cd = l @ q2 @ np.diag(spec) @ q2.T @ l.T
cd = (cd + cd.T) / 2


def timeit(name, f, reps=30):
    f(); f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); f(); ts.append((time.perf_counter() - t) * 1e3)
    print(f"| {name} | {st.median(ts):.3f} | {min(ts):.3f} |", flush=True)


print("| what | median ms | min ms |\n|---|---|---|")
a_host = np.linalg.solve(l, np.linalg.solve(l, cd).T)  # L^-1 C L^-T
timeit("numpy eigh (host, default threads)", lambda: np.linalg.eigh(a_host))
try:
    import scipy.linalg as sl
    timeit("scipy eigh subset top-10 (dsyevr)", lambda: sl.eigh(a_host, subset_by_index=[n - k, n - 1]))
    timeit("scipy eigh evd", lambda: sl.eigh(a_host, driver="evd"))
except Exception as e:
    print("scipy:", e)
try:
    import torch
    for th in (1, 16):
        torch.set_num_threads(th)
        ta = torch.from_numpy(a_host)
        timeit(f"torch eigh cpu {th} threads", lambda: torch.linalg.eigh(ta))
    dev = torch.device("cuda")
    ga = torch.from_numpy(a_host).to(dev)
    gcd, gcn = torch.from_numpy(cd).to(dev), torch.from_numpy(cn).to(dev)

    def g_eigh():
        w, v = torch.linalg.eigh(ga); torch.cuda.synchronize()
    timeit("torch eigh cuda f64 (syevd)", g_eigh)

    def g_chain():
        L = torch.linalg.cholesky(gcn)
        x = torch.linalg.solve_triangular(L, gcd, upper=False)
        a = torch.linalg.solve_triangular(L, x.T, upper=False)
        w, v = torch.linalg.eigh(a)
        t = torch.linalg.solve_triangular(L.T, v[:, -k:], upper=True)
        torch.cuda.synchronize()
    timeit("torch cuda chain: chol + 2 trsm + eigh + trsm", g_chain)
    gcd32 = gcd.float(); ga32 = ga.float()

    def g_eigh32():
        torch.linalg.eigh(ga32); torch.cuda.synchronize()
    timeit("torch eigh cuda f32 (reference)", g_eigh32)
except Exception as e:
    print("torch:", e)
try:
    import cupy as cp
    ca = cp.asarray(a_host)

    def c_eigh():
        cp.linalg.eigh(ca); cp.cuda.Device().synchronize()
    timeit("cupy eigh f64 (syevd)", c_eigh)
    try:
        from cupyx import cusolver as cxs
        def c_syevj():
            cxs.syevj(ca, with_eigen_vector=True); cp.cuda.Device().synchronize()
        timeit("cupy syevj f64", c_syevj)
    except Exception as e:
        print("cupy syevj:", e)
except Exception as e:
    print("cupy:", e)
w_ref = np.linalg.eigvalsh(a_host)
print("top eigenvalues", w_ref[-3:])
