#!/usr/bin/python3
"""How much of a shaped link one TCP stream fills, against several: run the receiver on one simulated
host and the sender on another (scripts/sim_cluster.sh), e.g.
  scripts/sim_cluster.sh up st 2 --rate 5gbit
  scripts/sim_cluster.sh run st 1 bench/cluster_tcp_streams.py recv 10.X.0.2 5600 2 4 &
  scripts/sim_cluster.sh run st 0 bench/cluster_tcp_streams.py send 10.X.0.2 5600 2 4
argv: recv|send ADDRESS PORT STREAMS SECONDS. The receiver prints the payload rate of all streams."""
import socket, sys, threading, time

mode, host, port, nstreams, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
if mode == "recv":
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); srv.bind((host, port)); srv.listen(16)
    total = [0]
    def drain(c):
        buf = bytearray(1 << 20); v = memoryview(buf)
        while True:
            n = c.recv_into(v)
            if n == 0: break
            total[0] += n
    ts = []
    for _ in range(nstreams):
        c, _ = srv.accept(); t = threading.Thread(target=drain, args=(c,)); t.start(); ts.append(t)
    t0 = time.time(); [t.join() for t in ts]; dt = time.time() - t0
    print(f"{nstreams} stream(s): {total[0]*8/dt/1e9:.2f} Gbit/s payload over {dt:.1f} s")
else:
    data = b"x" * (1 << 20)
    def push():
        s = socket.create_connection((host, port)); end = time.time() + secs
        while time.time() < end: s.sendall(data)
        s.close()
    ts = [threading.Thread(target=push) for _ in range(nstreams)]; [t.start() for t in ts]; [t.join() for t in ts]
