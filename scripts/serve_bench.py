#!/usr/bin/env python3
"""`tfpipe serve` against a Keras model behind a small Python web app, same MLP.

Measures, for each server: process start to /v2/health/ready = 200 (median of
--starts runs); the first request after ready against the steady p50 of the
next 200, at batch 1 and at batch 256 (a fresh process each, --first-runs of
them for tfpipe, medians): on one keep-alive connection opened before the
first request ("keep"), and with a new connection per request, the first
against the p50 of the next 200 new connections ("fresh"), and (keep) against
the p50 of 20 requests each after 50 ms of idle; whether batch sizes
the warm-up did not run cost more the first time (every size 1..256 after a
batch-1 request, the first time against two later times, --sizes-runs
processes); and, with wrk
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


def connect(port):
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.connect()
    return conn


def first_vs_steady(kind, args, port, batch, mode="keep"):
    """One process: the first request against the p50 of the next 200. `keep`: one connection,
    opened before the clock starts; `fresh`: a new connection per request (each opened untimed)."""
    p, _ = start(kind, args, port)
    path = "/v1/models/mnist:predict"
    conn = connect(port)
    first = post(conn, path, body(batch, 1))
    steady = []
    for i in range(200):
        if mode == "fresh":
            conn.close()
            conn = connect(port)
        steady.append(post(conn, path, body(batch, 2 + i % 4)))
    # Requests after 50 ms of idle, as traffic that is not back to back arrives.
    paced = []
    for i in range(20 if mode == "keep" else 0):
        time.sleep(0.05)
        paced.append(post(conn, path, body(batch, 2 + i % 4)))
    conn.close()
    stop(p)
    p50 = statistics.median(steady)
    out = {"first_ms": first * 1e3, "steady_p50_ms": p50 * 1e3, "ratio": first / p50}
    if paced:
        out["paced_p50_ms"] = statistics.median(paced) * 1e3
        out["ratio_paced"] = first / statistics.median(paced)
    return out


def first_vs_steady_runs(kind, args, port, batch, mode, runs):
    """Medians over `runs` processes, and every run's ratio."""
    rs = [first_vs_steady(kind, args, port, batch, mode) for _ in range(runs)]
    med = lambda key: statistics.median(r[key] for r in rs)
    out = {"first_ms": med("first_ms"), "steady_p50_ms": med("steady_p50_ms"), "ratio": med("ratio"),
           "ratios": sorted(round(r["ratio"], 2) for r in rs)}
    if "paced_p50_ms" in rs[0]:
        out.update(paced_p50_ms=med("paced_p50_ms"), ratio_paced=med("ratio_paced"))
    return out


def unwarmed_sizes(args, port, runs):
    """First-call cost at each batch size 1..256: in one process, three rounds of (a batch-1
    request, then one at size s) for every s; the first round's request at s (the first ever at s)
    against the median of the two later ones (the same switch from batch 1, s seen before)."""
    sizes = range(1, 257)
    per_run = []
    for _ in range(runs):
        p, _ = start("tfpipe", args, port)
        conn = connect(port)
        path = "/v1/models/mnist:predict"
        rounds = []
        for r in range(3):
            t = {}
            for s in sizes:
                post(conn, path, body(1, 9))
                t[s] = post(conn, path, body(s, 1 + r))
            rounds.append(t)
        conn.close()
        stop(p)
        per_run.append({s: rounds[0][s] / statistics.median([rounds[1][s], rounds[2][s]]) for s in sizes})
    warmed = {1 << i for i in range(9)}
    out = {}
    for name, group in (("warmed", [s for s in sizes if s in warmed]), ("not_warmed", [s for s in sizes if s not in warmed])):
        ratios = sorted(statistics.median(r[s] for r in per_run) for s in group)
        out[name] = {"sizes": len(ratios), "median": statistics.median(ratios),
                     "p90": ratios[int(0.9 * (len(ratios) - 1))], "max": ratios[-1],
                     "over_1_2": sum(x > 1.2 for x in ratios)}
    return out


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
    ap.add_argument("--first-runs", type=int, default=7)
    ap.add_argument("--sizes-runs", type=int, default=3)
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
            if kind == "tfpipe":
                for mode in ("keep", "fresh"):
                    res[kind][f"batch{batch}_{mode}"] = first_vs_steady_runs(
                        kind, args, args.port, batch, mode, args.first_runs)
            else:
                res[kind][f"batch{batch}_keep"] = first_vs_steady(kind, args, args.port, batch)
        if kind == "tfpipe":
            res[kind]["unwarmed_sizes"] = unwarmed_sizes(args, args.port, args.sizes_runs)
        for conns in (1, 8, 64):
            modes = [("batching", True), ("no_batching", False)] if kind == "tfpipe" else [("", True)]
            for name, batching in modes:
                p, _ = start(kind, args, args.port, batching)
                res[kind][f"wrk_c{conns}{'_' + name if name else ''}"] = wrk(args.port, conns, args.seconds)
                stop(p)
    res["load_after"] = os.getloadavg()
    print(json.dumps(res))
    print("\n| server | connection | start to ready | first / steady p50, batch 1 | first / steady p50, batch 256 |")
    print("|---|---|---|---|---|")
    for kind in kinds:
        r = res[kind]
        cell = lambda b: f"{r[b]['first_ms']:.2f} / {r[b]['steady_p50_ms']:.2f} ms ({r[b]['ratio']:.2f}x)"
        for mode in ("keep", "fresh"):
            if f"batch1_{mode}" in r:
                print(f"| {kind} | {mode} | {r['start_to_ready_ms']:.0f} ms | {cell(f'batch1_{mode}')} | {cell(f'batch256_{mode}')} |")
        if "paced_p50_ms" in r.get("batch1_keep", {}):
            paced = lambda b: f"{r[b]['paced_p50_ms']:.2f} ms (first: {r[b]['ratio_paced']:.2f}x)"
            print(f"| {kind} | keep, p50 after 50 ms idle | | {paced('batch1_keep')} | {paced('batch256_keep')} |")
    if "tfpipe" in res:
        print("\n| batch sizes | sizes | first / seen, median | p90 | max | over 1.2x |")
        print("|---|---|---|---|---|---|")
        for name, u in res["tfpipe"]["unwarmed_sizes"].items():
            print(f"| {name} | {u['sizes']} | {u['median']:.2f} | {u['p90']:.2f} | {u['max']:.2f} | {u['over_1_2']} |")
    print("\n| server | connections | req/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for kind in kinds:
        for key, w in res[kind].items():
            if key.startswith("wrk_"):
                label = key[4:].replace("_", " ")
                print(f"| {kind} | {label} | {w['req_per_s']:.0f} | {w['p50_ms']:.2f} | {w['p99_ms']:.2f} |")


if __name__ == "__main__":
    main()
