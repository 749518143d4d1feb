#!/usr/bin/env python3
"""`tfpipe serve`'s first :predict after ready against the p50 of the next 200, before and after.

Usage (from the repository root, after `cargo build --release`):
    python3 scripts/serve_first_probe.py MODELS ROWS MODE N BIN [BIN ...]

MODELS: a base directory of the MNIST MLP (image_raw uint8 [784]); ROWS: examples per request;
MODE: `keep` (the first request on a connection opened just before it, untimed, against the next
200 on that connection) or `fresh` (a new connection, opened untimed, for every request); N:
processes per binary, the binaries interleaved process for process so that a before and after
share the load. Raw sockets, so the client adds little. Prints per binary the median first and
steady p50, every ratio, and the server's minor page faults during its first request.

Environment, for probing what the first request pays:
  PRE=sleepMS  wait MS ms between connecting and the first request;
  PRE=get      a GET /v2/health/ready on the connection before it;
  PRE=other    a :predict on another connection before it;
  GAP=MS       also 15 requests each after MS ms of idle ("paced", their p50).
"""
import base64, json, os, random, socket, statistics, subprocess, sys, time

models, rows, mode, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
bins = sys.argv[5:]


def body(rows, seed):
    rng = random.Random(seed)
    inst = [{"image_raw": {"b64": base64.b64encode(bytes(rng.getrandbits(8) for _ in range(784))).decode()}}
            for _ in range(rows)]
    return json.dumps({"instances": inst}).encode()


BODIES = [body(rows, s) for s in range(5)]


def req(method, path, payload=b""):
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    return head.encode() + payload


def exchange(s, data):
    s.sendall(data)
    buf = b""
    while b"\r\n\r\n" not in buf:
        c = s.recv(1 << 20)
        if not c:
            raise EOFError
        buf += c
    i = buf.index(b"\r\n\r\n") + 4
    length = 0
    for line in buf[:i].decode().lower().split("\r\n"):
        if line.startswith("content-length:"):
            length = int(line.split(":")[1])
    while len(buf) < i + length:
        buf += s.recv(1 << 20)
    return int(buf[9:12])


def conn(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def minflt(pid):
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[7])


def one(binary, port):
    p = subprocess.Popen([binary, "serve", "--model", f"mnist={models}", "--port", str(port),
                          "--poll-seconds", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ready = req("GET", "/v2/health/ready")
    while True:
        try:
            s = conn(port)
            ok = exchange(s, ready) == 200
            s.close()
            if ok:
                break
        except OSError:
            pass
        time.sleep(0.0005)
    path = "/v1/models/mnist:predict"
    s = conn(port)
    pre = os.environ.get("PRE", "")
    if pre == "get":
        exchange(s, ready)
    elif pre == "meta":
        exchange(s, req("GET", "/v1/models/mnist/metadata"))
    elif pre.startswith("sleep"):
        time.sleep(float(pre[5:]) / 1e3)
    elif pre == "other":
        s2 = conn(port); exchange(s2, req("POST", path, BODIES[4])); s2.close()
    f0 = minflt(p.pid)
    t = time.perf_counter()
    assert exchange(s, req("POST", path, BODIES[0])) == 200
    first = time.perf_counter() - t
    faults = minflt(p.pid) - f0
    steady = []
    for i in range(200):
        if mode == "fresh":
            s.close()
            s = conn(port)
        t = time.perf_counter()
        assert exchange(s, req("POST", path, BODIES[1 + i % 4])) == 200
        steady.append(time.perf_counter() - t)
    paced = []
    gap = float(os.environ.get("GAP", "0"))
    for i in range(15 if gap else 0):
        time.sleep(gap / 1e3)
        t = time.perf_counter()
        assert exchange(s, req("POST", path, BODIES[1 + i % 4])) == 200
        paced.append(time.perf_counter() - t)
    if paced:
        PACED.append(statistics.median(paced) * 1e3)
    s.close()
    p.terminate()
    p.wait()
    return first * 1e3, statistics.median(steady) * 1e3, faults


res = {b: [] for b in bins}
PACED = []
port = 18700 + os.getpid() % 500
for k in range(n):
    for b in bins:
        res[b].append(one(b, port))
        port += 1
print(f"rows {rows} mode {mode} n {n} load {open('/proc/loadavg').read().split()[:3]}")
for b, r in res.items():
    ratios = sorted(f / s for f, s, _ in r)
    print(f"{b}: first {statistics.median(x[0] for x in r):.3f} ms steady {statistics.median(x[1] for x in r):.3f} ms "
          f"paced {statistics.median(PACED) if PACED else 0:.3f} ratio median {statistics.median(ratios):.2f} [{', '.join(f'{x:.2f}' for x in ratios)}] faults {[x[2] for x in r]}")
