#!/usr/bin/env python3
"""`tfpipe predict`'s first prediction against its steady p50, at several batch sizes.

For each round, and each batch size in turn, one fresh `tfpipe predict` process per binary
(binaries interleaved process for process, so a before/after shares the load); reads the
`latency first X ms, steady p50 Y ms` line it prints and reports, per binary and batch size, the
median first, steady p50 and first/steady ratio, with every ratio. Write `cat /proc/loadavg` next
to the numbers.

Usage (from the repository root, after `cargo build --release`):
    python3 scripts/predict_first.py --checkpoint CK --data FILES [--batch-sizes 1 32 256]
        [--runs 7] [--warmup N] [BIN ...]          (default BIN: target/release/tfpipe)
CK: e.g. the MNIST MLP 784-256-10 that `benches/serve.rs` or docs/benchmarks.md trains.
"""
import argparse
import re
import statistics
import subprocess

LINE = re.compile(r"latency\s+first ([0-9.]+) ms, steady p50 ([0-9.]+) ms")


def one(binary, args, batch):
    cmd = [binary, "predict", "--checkpoint", args.checkpoint, "--data", *args.data,
           "--batch-size", str(batch), "--output", "/dev/null"]
    if args.warmup is not None:
        cmd += ["--warmup", str(args.warmup)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    m = LINE.search(out.stdout + out.stderr)
    if not m:
        raise SystemExit(f"no latency line from {cmd}:\n{out.stderr}")
    return float(m.group(1)), float(m.group(2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", nargs="+", required=True)
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 32, 256])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("bins", nargs="*", default=["target/release/tfpipe"])
    args = ap.parse_args()
    load = open("/proc/loadavg").read().split()[:3]
    res = {(b, s): [] for b in args.bins for s in args.batch_sizes}
    for _ in range(args.runs):
        for s in args.batch_sizes:
            for b in args.bins:
                res[(b, s)].append(one(b, args, s))
    print(f"load before {load}, after {open('/proc/loadavg').read().split()[:3]}")
    print("| binary | batch | first | steady p50 | first / steady (median; every run) |")
    print("| --- | --- | --- | --- | --- |")
    for (b, s), r in res.items():
        ratios = sorted(f / st for f, st in r)
        print(f"| {b} | {s} | {statistics.median(f for f, _ in r):.3f} ms | "
              f"{statistics.median(st for _, st in r):.3f} ms | {statistics.median(ratios):.2f}x; "
              f"{', '.join(f'{x:.2f}' for x in ratios)} |")


if __name__ == "__main__":
    main()
