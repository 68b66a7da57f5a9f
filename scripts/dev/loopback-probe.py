# Raw loopback TCP throughput on this host: one connection, 299 MiB sent from memory by one process,
# received by another into a reused 1 or 4 MiB buffer (no disk, no hashing): the ceiling of an HTTP
# upload's ingest.
#   python3 scripts/dev/loopback-probe.py
import os, socket, sys, time, multiprocessing as mp
N = 299 << 20
def sender(port, q):
    data = os.urandom(64 << 20)
    s = socket.create_connection(("127.0.0.1", port))
    q.put(time.perf_counter())
    left = N
    while left > 0:
        n = min(left, len(data)); s.sendall(memoryview(data)[:n]); left -= n
    s.shutdown(socket.SHUT_WR); s.recv(1); s.close()
for bufsize in (1 << 20, 4 << 20):
    for run in range(3):
        ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1); port = ls.getsockname()[1]
        q = mp.Queue(); p = mp.Process(target=sender, args=(port, q)); p.start()
        c, _ = ls.accept(); buf = bytearray(bufsize); got = 0
        t0 = q.get()
        while True:
            n = c.recv_into(buf)
            if n == 0: break
            got += n
        dt = time.perf_counter() - t0
        c.send(b"x"); c.close(); p.join(); ls.close()
        print("recv into %d MiB buffer: %.0f MB in %.1f ms = %.2f GB/s" % (bufsize >> 20, got / 1e6, dt * 1e3, got / dt / 1e9), flush=True)
