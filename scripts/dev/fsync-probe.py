# What a synced commit of the job database costs on this disk: a small append + fdatasync, when the
# disk is idle, and while a freshly written 37 MB file (a result) is synced in another thread, in one
# call or a piece at a time (1 MiB, sync_file_range, two pieces in flight: storage/local.rs).
#   python3 scripts/dev/fsync-probe.py DIR
import ctypes, os, statistics, sys, tempfile, threading, time
d = sys.argv[1] if len(sys.argv) > 1 else tempfile.gettempdir()
libc = ctypes.CDLL("libc.so.6", use_errno=True)
WRITE, WAIT_ALL = 2, 7
small = os.path.join(d, "wal"); big = os.path.join(d, "big")
fd = os.open(small, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
def commit():
    os.write(fd, os.urandom(4096)); t = time.perf_counter(); os.fdatasync(fd); return (time.perf_counter() - t) * 1e3
idle = [commit() for _ in range(30)]
print("4 KiB append + fdatasync, idle: median %.2f ms (min %.2f, max %.2f)" % (statistics.median(idle), min(idle), max(idle)))
data = os.urandom(37 << 20)
def whole(g):
    os.fsync(g)
def pieces(g, piece=1 << 20):
    n = os.fstat(g).st_size
    for at in range(0, n, piece):
        libc.sync_file_range(g, ctypes.c_int64(at), ctypes.c_int64(piece), WRITE)
        if at >= piece:
            libc.sync_file_range(g, ctypes.c_int64(at - piece), ctypes.c_int64(piece), WAIT_ALL)
    os.fsync(g)
for name, how in [("in one call", whole), ("in 1 MiB pieces", pieces)]:
    small_ms, big_ms = [], []
    for _ in range(5):
        with open(big, "wb") as f: f.write(data)
        def sync_big():
            g = os.open(big, os.O_RDONLY); t = time.perf_counter(); how(g); os.close(g); big_ms.append((time.perf_counter() - t) * 1e3)
        th = threading.Thread(target=sync_big); th.start(); time.sleep(0.003)
        small_ms.append(commit()); th.join(); os.unlink(big)
    print("commit while 37 MB is synced %s: %s ms; the 37 MB sync: %s ms" % (name, ", ".join("%.1f" % v for v in small_ms), ", ".join("%.1f" % v for v in big_ms)))
