# What the data disk of this host can take: buffered writes + fdatasync (what the upload writer does),
# and O_DIRECT writes from 1, 4 and 8 threads (a deeper queue), 1 GiB each, then the page-cache cost
# of a 37 MB result (1087 x 614 x 14 float32): a fresh file, an overwrite of a cached spare, two files.
#   python3 scripts/dev/disk-probe.py DIR
import mmap, os, statistics, sys, tempfile, threading, time
base = sys.argv[1] if len(sys.argv) > 1 else tempfile.gettempdir()
TOTAL, BLOCK = 1 << 30, 8 << 20
buf = mmap.mmap(-1, BLOCK)                      # page-aligned, as O_DIRECT needs
buf.write(os.urandom(BLOCK))

def buffered(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    t = time.perf_counter()
    for at in range(0, TOTAL, BLOCK):
        os.pwrite(fd, buf, at)
    os.fdatasync(fd)
    dt = time.perf_counter() - t
    os.close(fd)
    return dt

def direct(path, threads):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    os.ftruncate(fd, TOTAL)
    offs = list(range(0, TOTAL, BLOCK))
    def work(k):
        for at in offs[k::threads]:
            os.pwrite(fd, buf, at)
    t = time.perf_counter()
    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    [x.start() for x in ts]; [x.join() for x in ts]
    os.fdatasync(fd)
    dt = time.perf_counter() - t
    os.close(fd)
    return dt

def run(name, fn):
    gbs = []
    for _ in range(3):
        p = os.path.join(base, "probe.bin")
        gbs.append(TOTAL / fn(p) / 1e9)
        os.unlink(p)
    print("%-34s %s GB/s" % (name, " / ".join("%.2f" % g for g in gbs)), flush=True)

run("buffered 8 MiB writes + fdatasync", buffered)
for n in (1, 4, 8, 16):
    run("O_DIRECT 8 MiB, %d thread(s)" % n, lambda p, n=n: direct(p, n))

N = 1087 * 614 * 14 * 4
data = os.urandom(N)
def fresh(d):
    t = time.perf_counter()
    with open(os.path.join(d, "r"), "wb") as f: f.write(data)
    return (time.perf_counter() - t) * 1e3
def warm(d):
    spare = os.path.join(d, "spare")
    with open(spare, "wb") as f: f.write(bytes(N))
    os.sync()
    t = time.perf_counter()
    fd = os.open(spare, os.O_WRONLY); os.pwrite(fd, data, 0); os.close(fd)
    os.rename(spare, os.path.join(d, "r"))
    return (time.perf_counter() - t) * 1e3
def halves(d):
    h = N // 2
    t = time.perf_counter()
    def w(i):
        with open(os.path.join(d, "r%d" % i), "wb") as f: f.write(memoryview(data)[i * h:(i + 1) * h])
    ts = [threading.Thread(target=w, args=(i,)) for i in range(2)]
    [x.start() for x in ts]; [x.join() for x in ts]
    return (time.perf_counter() - t) * 1e3
for name, fn in [("37 MB result, fresh file", fresh), ("37 MB, overwrite a clean cached spare", warm), ("37 MB as two files, two threads", halves)]:
    ts = []
    for _ in range(7):
        d = tempfile.mkdtemp(dir=base); ts.append(fn(d))
        for f in os.listdir(d): os.unlink(os.path.join(d, f))
        os.rmdir(d)
    print("%-40s median %.1f ms (min %.1f, max %.1f)" % (name, statistics.median(ts), min(ts), max(ts)), flush=True)
