# How fast can 27 MB of results reach the page cache on this host: one write, pwrite from threads,
# a shared mapping filled by threads, one write into a file reserved first (fallocate); one file and two
# at once (the service wrote .npy + ENVI until 2026-11-25).
import mmap, os, statistics, sys, tempfile, threading, time
import numpy as np
N = 1087 * 614 * 10 * 4
data = np.random.default_rng(0).random(N // 4, dtype=np.float32).view(np.uint8)
base = sys.argv[1] if len(sys.argv) > 1 else tempfile.gettempdir()
PIECE = 2 << 20

def one_write(path):
    with open(path, "wb") as f:
        f.write(memoryview(data))

def fallocate_write(path):
    with open(path, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, N)
        f.write(memoryview(data))

def pwrite_threads(path, n=8):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, N)
    pieces = list(range(0, N, PIECE))
    def work(k):
        for at in pieces[k::n]:
            os.pwrite(fd, memoryview(data)[at:at + PIECE], at)
    ts = [threading.Thread(target=work, args=(k,)) for k in range(n)]
    [t.start() for t in ts]; [t.join() for t in ts]
    os.close(fd)

def mmap_threads(path, n=8):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, N)
    m = mmap.mmap(fd, N)
    dst = np.frombuffer(m, dtype=np.uint8)
    pieces = list(range(0, N, PIECE))
    def work(k):
        for at in pieces[k::n]:
            np.copyto(dst[at:at + PIECE], data[at:at + PIECE])
    ts = [threading.Thread(target=work, args=(k,)) for k in range(n)]
    [t.start() for t in ts]; [t.join() for t in ts]
    del dst; m.close(); os.close(fd)

def two_files(fn):
    def run(path):
        ts = [threading.Thread(target=fn, args=(path + s,)) for s in ("a", "b")]
        [t.start() for t in ts]; [t.join() for t in ts]
    return run

for name, fn in [("one write", one_write), ("fallocate, one write", fallocate_write), ("pwrite x8", pwrite_threads), ("mmap x8", mmap_threads),
                 ("two files, one write each", two_files(one_write)), ("two files, pwrite x8 each", two_files(pwrite_threads)),
                 ("two files, mmap x8 each", two_files(mmap_threads))]:
    times = []
    for i in range(7):
        d = tempfile.mkdtemp(dir=base)
        p = os.path.join(d, "r")
        t = time.perf_counter(); fn(p); times.append((time.perf_counter() - t) * 1e3)
        for f in os.listdir(d): os.unlink(os.path.join(d, f))
        os.rmdir(d)
    print("%-28s median %.1f ms  (min %.1f, max %.1f)" % (name, statistics.median(times), min(times), max(times)))
