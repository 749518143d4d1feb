#!/usr/bin/env python3
"""What a new connection's first request costs on a warm `tfpipe serve`: for each of CONNS new
connections, its first request against the median of its 2nd to 4th. The first half of the
connections is taken by connection threads that never served before, the second half (CONNS 256
against 128 threads) by threads that did. docs/benchmarks.md, "Serving".

Usage: python3 scripts/serve_connection_probe.py PORT BATCH CONNS (a server of the MNIST MLP
serving as "mnist" on PORT)
"""
import sys, time, statistics, http.client, json, base64, random
port, batch, conns = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(0)
body = json.dumps({"instances": [{"image_raw": {"b64": base64.b64encode(bytes(rng.getrandbits(8) for _ in range(784))).decode()}} for _ in range(batch)]}).encode()
def post(c):
    t = time.perf_counter(); c.request("POST", "/v1/models/mnist:predict", body, {"Content-Type": "application/json"})
    r = c.getresponse(); r.read(); assert r.status == 200; return time.perf_counter() - t
firsts, laters = [], []
for i in range(conns):
    c = http.client.HTTPConnection("127.0.0.1", port); c.connect()
    ts = [post(c) for _ in range(4)]
    c.close()
    firsts.append(ts[0]); laters.append(statistics.median(ts[1:]))
half = conns // 2
for name, sl in (("first half", slice(0, half)), ("second half", slice(half, conns))):
    f, l = statistics.median(firsts[sl]), statistics.median(laters[sl])
    print(f"{name}: first {f*1e3:.3f} ms, later {l*1e3:.3f} ms, ratio {f/l:.2f}")
