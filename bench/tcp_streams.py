"""Does a message between two processes move faster over several TCP connections than over one?

Two processes exchange messages of M bytes (both send and receive at once, as the steps of a
ring or of recursive halving do), each message split over K connections, one sending and one
receiving thread per connection and side. Prints GB/s per direction for each (M, K), the median
of ROUNDS rounds with the K values alternating inside each round.

    python bench/tcp_streams.py [HOST] [ROUNDS]     # HOST default 127.0.0.1

Python's `sendall` and `recv_into` release the GIL, so the threads copy in parallel; the
question is whether the kernel's per-connection work (one thread copying in, one out) is the
limit, as it can be on a fast network or loopback with CPUs to spare.
"""

import os
import socket
import statistics
import sys
import threading
import time

HOST = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
STREAMS = (1, 2, 4, 8)
SIZES = (256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
BUF = 4 << 20


def connections(listener, k, dial):
    """K connected sockets, in the same order on both sides."""
    out = []
    for _ in range(k):
        if dial:
            s = socket.create_connection((HOST, dial))
        else:
            s, _ = listener.accept()
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUF)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUF)
        out.append(s)
    return out


def exchange(socks, size, iters):
    """Seconds per exchange of `size` bytes split over `socks`."""
    k = len(socks)
    part = size // k
    send = memoryview(bytearray(part))
    recv = [memoryview(bytearray(part)) for _ in range(k)]
    gate = threading.Barrier(2 * k + 1)

    def sender(s):
        for _ in range(iters):
            gate.wait()
            s.sendall(send)
            gate.wait()

    def receiver(s, buf):
        for _ in range(iters):
            gate.wait()
            got = 0
            while got < part:
                n = s.recv_into(buf[got:])
                if n == 0:
                    raise RuntimeError("peer closed")
                got += n
            gate.wait()

    threads = [threading.Thread(target=sender, args=(s,)) for s in socks]
    threads += [threading.Thread(target=receiver, args=(s, b)) for s, b in zip(socks, recv)]
    for t in threads:
        t.start()
    times = []
    for _ in range(iters):
        gate.wait()
        t0 = time.perf_counter()
        gate.wait()
        times.append(time.perf_counter() - t0)
    for t in threads:
        t.join()
    return statistics.median(times)


def side(port, dial):
    listener = None
    if not dial:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, port))
        listener.listen(64)
        os.write(wfd, b"x")
    pools = {k: connections(listener, k, port if dial else None) for k in STREAMS}
    results = {}
    for _ in range(ROUNDS):
        for size in SIZES:
            iters = max(3, min(50, (256 << 20) // size))
            for k in STREAMS:
                t = exchange(pools[k], size, iters)
                results.setdefault((size, k), []).append(t)
    return results


if __name__ == "__main__":
    probe = socket.socket()
    probe.bind((HOST, 0))
    port = probe.getsockname()[1]
    probe.close()
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        side(port, None)
        os._exit(0)
    os.read(rfd, 1)
    res = side(port, port)
    os.waitpid(pid, 0)
    print(f"# two processes exchanging over {HOST}, {os.cpu_count()} CPUs, {ROUNDS} rounds; GB/s per direction")
    print("# " + f"{'bytes':>10}" + "".join(f" {f'{k} conn':>9}" for k in STREAMS) + "  best/1")
    for size in SIZES:
        rates = [size / statistics.median(res[(size, k)]) / 1e9 for k in STREAMS]
        print(f"  {size:>10}" + "".join(f" {r:9.2f}" for r in rates) + f"  {max(rates) / rates[0]:.2f}")
