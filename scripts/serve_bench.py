#!/usr/bin/env python3
"""`tfpipe serve` against a Keras model behind a small Python web app, same MLP.

Measures, for each server: process start to /v2/health/ready = 200 (median of
--starts runs); the first request after ready against the steady p50 of the
next 200, at batch 1 and at batch 256 (a fresh process each); and, with wrk
(`apt-get install wrk`), throughput and p50/p99 latency at 1, 8 and 64
connections, tfpipe with and without dynamic batching. Prints a Markdown
table and one JSON line; write the load (`uptime`) next to the numbers.

Usage (from the repository root, after `cargo build --release`):
    python3 scripts/serve_bench.py CHECKPOINT_DIR [--venv /work/venv-tf] [--tfpipe target/release/tfpipe]
CHECKPOINT_DIR: an MNIST MLP (image_raw uint8 [784]), e.g. `tfpipe demo`'s checkpoint.
"""
import argparse
import base64
import functools
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def body(batch, seed=0):
    rng = random.Random(seed)
    rows = [{"image_raw": {"b64": base64.b64encode(bytes(rng.getrandbits(8) for _ in range(784))).decode()}}
            for _ in range(batch)]
    return json.dumps({"instances": rows}).encode()


def ready(port):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        c.request("GET", "/v2/health/ready")
        ok = c.getresponse().status == 200
        c.close()
        return ok
    except OSError:
        return False


def start(kind, args, port, batching=True):
    if kind == "tfpipe":
        cmd = [args.tfpipe, "serve", "--model", f"mnist={args.checkpoint}", "--port", str(port),
               "--poll-seconds", "0", "--enable-batching", "true" if batching else "false"]
    else:
        cmd = [os.path.join(args.venv, "bin", "python"), os.path.join(ROOT, "scripts", "keras_serve.py"),
               args.checkpoint, "--port", str(port)]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    while not ready(port):
        if p.poll() is not None:
            sys.exit(f"{kind} exited: {cmd}")
        time.sleep(0.0005)
    return p, time.perf_counter() - t0


def stop(p):
    p.terminate()
    p.wait()


def post(conn, path, payload):
    t = time.perf_counter()
    conn.request("POST", path, payload, {"Content-Type": "application/json"})
    r = conn.getresponse()
    r.read()
    assert r.status == 200, r.status
    return time.perf_counter() - t


def first_vs_steady(kind, args, port, batch):
    p, _ = start(kind, args, port)
    conn = http.client.HTTPConnection("127.0.0.1", port)
    path = "/v1/models/mnist:predict"
    first = post(conn, path, body(batch, 1))
    steady = [post(conn, path, body(batch, 2 + i % 4)) for i in range(200)]
    conn.close()
    stop(p)
    p50 = statistics.median(steady)
    return {"first_ms": first * 1e3, "steady_p50_ms": p50 * 1e3, "ratio": first / p50}


def wrk(port, conns, seconds):
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        payload = body(1, 7).decode()
        f.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n')
        f.write(f"wrk.body = {json.dumps(payload)}\n")
        script = f.name
    out = subprocess.run(["wrk", f"-t{min(conns, 2)}", f"-c{conns}", f"-d{seconds}s", "--latency", "-s", script,
                          f"http://127.0.0.1:{port}/v1/models/mnist:predict"],
                         capture_output=True, text=True, check=True).stdout
    os.unlink(script)

    def ms(label):
        m = re.search(rf"^\s*{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"req_per_s": rps, "p50_ms": ms("50%"), "p99_ms": ms("99%"),
            "non_2xx": int(errors.group(1)) if errors else 0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--venv", default="/work/venv-tf")
    ap.add_argument("--tfpipe", default=os.path.join(ROOT, "target", "release", "tfpipe"))
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--port", type=int, default=18501)
    ap.add_argument("--skip-keras", action="store_true")
    args = ap.parse_args()
    kinds = ["tfpipe"] + ([] if args.skip_keras else ["keras"])
    res = {"load": os.getloadavg()}
    for kind in kinds:
        starts = []
        for _ in range(args.starts if kind == "tfpipe" else 2):
            p, t = start(kind, args, args.port)
            stop(p)
            starts.append(t * 1e3)
        res[kind] = {"start_to_ready_ms": statistics.median(starts), "starts_ms": starts}
        for batch in (1, 256):
            res[kind][f"batch{batch}"] = first_vs_steady(kind, args, args.port, batch)
        for conns in (1, 8, 64):
            modes = [("batching", True), ("no_batching", False)] if kind == "tfpipe" else [("", True)]
            for name, batching in modes:
                p, _ = start(kind, args, args.port, batching)
                res[kind][f"wrk_c{conns}{'_' + name if name else ''}"] = wrk(args.port, conns, args.seconds)
                stop(p)
    res["load_after"] = os.getloadavg()
    print(json.dumps(res))
    print("\n| server | start to ready | first / steady p50, batch 1 | first / steady p50, batch 256 |")
    print("|---|---|---|---|")
    for kind in kinds:
        r = res[kind]
        cell = lambda b: f"{r[b]['first_ms']:.2f} / {r[b]['steady_p50_ms']:.2f} ms ({r[b]['ratio']:.2f}x)"
        print(f"| {kind} | {r['start_to_ready_ms']:.0f} ms | {cell('batch1')} | {cell('batch256')} |")
    print("\n| server | connections | req/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for kind in kinds:
        for key, w in res[kind].items():
            if key.startswith("wrk_"):
                label = key[4:].replace("_", " ")
                print(f"| {kind} | {label} | {w['req_per_s']:.0f} | {w['p50_ms']:.2f} | {w['p99_ms']:.2f} |")


if __name__ == "__main__":
    main()
