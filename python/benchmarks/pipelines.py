"""Side-by-side input pipelines on one job, each in a fresh process.

The job (issue 16, section 6): 500,000 MNIST-like records in 8 shards,
interleave 4, shuffle 10,000, batch 256, parse to numpy, one pass. For each
contender: examples per second (pipeline construction to the last batch) and
process start to first batch (a fresh `python -c`, imports included).

    python python/benchmarks/pipelines.py --make          # writes /tmp/mnist500k (once)
    python python/benchmarks/pipelines.py --tf-python /work/venv-tf/bin/python \
        --tfpipe-bin target/release/tfpipe

Contenders that cannot run here (their package is missing) are reported as
skipped, with the reason. Run it on a quiet machine; the script prints the
load average next to every number, since a shared machine skews them.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = "/tmp/mnist500k"
N = 500_000

TFPIPE = r"""
import time, tfpipe
t0 = time.time()
ds = (tfpipe.Dataset.tfrecord(sorted(FILES)).interleave(4, 16, num_parallel_calls="auto")
      .shuffle(10_000, seed=0).batch(256).parse(["image_raw:uint8:28x28", "label:int64"]).prefetch(2))
n = 0; first = None
for b in ds:
    if first is None: first = time.time()
    n += len(b["label"])
"""

TFDATA = r"""
import time
import tensorflow as tf
t0 = time.time()
spec = {"image_raw": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
def parse(batch):
    f = tf.io.parse_example(batch, spec)
    return tf.reshape(tf.io.decode_raw(f["image_raw"], tf.uint8), [-1, 28, 28]), f["label"]
ds = (tf.data.Dataset.from_tensor_slices(sorted(FILES))
      .interleave(tf.data.TFRecordDataset, cycle_length=4, block_length=16, num_parallel_calls=tf.data.AUTOTUNE)
      .shuffle(10_000, seed=0).batch(256).map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE))
n = 0; first = None
for images, labels in ds.as_numpy_iterator():
    if first is None: first = time.time()
    n += len(labels)
"""

# The `tfrecord` package's own loader (no torch): records parsed in Python,
# files interleaved 4 at a time (16 records each), its shuffle buffer, numpy batches.
TFRECORD_PKG = r"""
import time, numpy as np
from tfrecord.iterator_utils import shuffle_iterator
t0 = time.time()
files = sorted(FILES)
from tfrecord.reader import tfrecord_loader
import itertools
def records():
    loaders = [tfrecord_loader(f, None, {"image_raw": "byte", "label": "int"}) for f in files]
    # interleave 4 at a time, 16 each, like the others
    active, rest = loaders[:4], loaders[4:]
    while active:
        for l in list(active):
            block = list(itertools.islice(l, 16))
            yield from block
            if len(block) < 16:
                active.remove(l)
                if rest: active.append(rest.pop(0))
it = shuffle_iterator(records(), 10_000)
n = 0; first = None
while True:
    chunk = list(itertools.islice(it, 256))
    if not chunk: break
    images = np.stack([np.frombuffer(r["image_raw"], dtype=np.uint8).reshape(28, 28) for r in chunk])
    labels = np.array([r["label"][0] for r in chunk])
    if first is None: first = time.time()
    n += len(labels)
"""

TORCH_DATALOADER = r"""
import time, numpy as np, torch
from tfrecord.torch.dataset import MultiTFRecordDataset
t0 = time.time()
files = sorted(FILES)
pattern = os.path.join(os.path.dirname(files[0]), "{}")
class PerWorker(torch.utils.data.IterableDataset):
    # MultiTFRecordDataset reads every file in every worker (each record once per worker): give
    # each worker its own files, as a user who noticed would.
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        mine = files if info is None else files[info.id::info.num_workers]
        splits = {os.path.basename(f): 1.0 for f in mine}
        return iter(MultiTFRecordDataset(pattern, None, splits, {"image_raw": "byte", "label": "int"},
                                         shuffle_queue_size=10_000, infinite=False))
ds = PerWorker()
loader = torch.utils.data.DataLoader(ds, batch_size=256, num_workers=WORKERS)
n = 0; first = None
for b in loader:
    if first is None: first = time.time()
    n += len(b["label"])
"""

GRAIN = r"""
import time, numpy as np, grain
from tfrecord import example_pb2
t0 = time.time()
files = sorted(FILES)
def parse(record):
    ex = example_pb2.Example(); ex.ParseFromString(record)
    f = ex.features.feature
    return {"image_raw": np.frombuffer(f["image_raw"].bytes_list.value[0], np.uint8).reshape(28, 28),
            "label": f["label"].int64_list.value[0]}
sources = [grain.experimental.TFRecordIterDataset(f) for f in files]
ds = grain.experimental.InterleaveIterDataset(grain.MapDataset.source(sources), cycle_length=4)
ds = grain.experimental.WindowShuffleIterDataset(ds, window_size=10_000, seed=0)
ds = ds.map(parse).batch(256)
n = 0; first = None
for b in ds:
    if first is None: first = time.time()
    n += len(b["label"])
"""

EPILOGUE = r"""
import json as _j, time as _t
print("RESULT " + _j.dumps({"examples": n, "seconds": _t.time() - t0, "first": first}))
"""


def run_python(python: str, body: str, files: list, env_extra=None) -> dict:
    code = "import os\nFILES = %r\n" % files + body + EPILOGUE
    env = dict(os.environ, **(env_extra or {}))
    start = time.time()
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=3600)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")][-1]
    r = json.loads(line[len("RESULT "):])
    r["first_batch_from_process_start_s"] = (r.pop("first") or start) - start
    r["examples_per_s"] = r["examples"] / r["seconds"]
    return r


def run_rust(binary: str, pattern: str) -> dict:
    if not os.path.exists(binary):
        return {"error": f"{binary}: not built (cargo build --release)"}
    out = subprocess.run(
        [binary, "bench", "--data", pattern, "--feature", "image_raw:uint8:28x28", "--feature", "label:int64",
         "--batch-size", "256", "--shuffle-buffer", "10000", "--cycle-length", "4", "--json"],
        capture_output=True, text=True, timeout=3600,
    )
    if out.returncode != 0:
        return {"error": out.stderr.strip()}
    r = json.loads(out.stdout)
    return {
        "examples": r["examples"], "seconds": r["seconds"], "examples_per_s": r["examples_per_sec"],
        "first_batch_from_process_start_s": r["time_to_first_batch_from_process_start_s"],
    }


def make_data(directory: str) -> None:
    """500k MNIST-like records (the bundled digits repeated) in 8 shards, written by tfpipe."""
    import numpy as np

    import tfpipe

    d = REPO / "testdata" / "mnist"
    images = np.frombuffer(gzip.open(d / "train-images-idx3-ubyte.gz").read()[16:], np.uint8).reshape(-1, 784)
    labels = np.frombuffer(gzip.open(d / "train-labels-idx1-ubyte.gz").read()[8:], np.uint8)
    os.makedirs(directory, exist_ok=True)
    per = N // 8
    for s in range(8):
        with tfpipe.TFRecordWriter(f"{directory}/mnist-{s:05d}-of-00008.tfrecord") as w:
            for i in range(s * per, (s + 1) * per):
                j = i % len(labels)
                w.write(tfpipe.encode_example({"image_raw": images[j].tobytes(), "label": int(labels[j])}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=DATA)
    p.add_argument("--make", action="store_true", help="write the 500k records first")
    p.add_argument("--python", default=sys.executable, help="the Python with tfpipe (and grain, tfrecord)")
    p.add_argument("--tf-python", default="/work/venv-tf/bin/python", help="a Python with tensorflow")
    p.add_argument("--tfpipe-bin", default=str(REPO / "target" / "release" / "tfpipe"))
    p.add_argument("--only", nargs="*", help="run only these contenders")
    args = p.parse_args()
    if args.make:
        make_data(args.data)
    files = sorted(glob.glob(f"{args.data}/mnist-*.tfrecord"))
    if len(files) != 8:
        sys.exit(f"{args.data}: expected 8 mnist-*.tfrecord shards (run with --make)")
    contenders = [
        ("tfpipe (Python)", lambda: run_python(args.python, TFPIPE, files)),
        ("tfpipe bench (Rust CLI)", lambda: run_rust(args.tfpipe_bin, f"{args.data}/mnist-*.tfrecord")),
        ("tf.data (TensorFlow)", lambda: run_python(args.tf_python, TFDATA, files, {"TF_CPP_MIN_LOG_LEVEL": "2"})),
        # On 2 cores tf.data's parallel interleave was up to 5x slower than one reader
        # (docs/benchmarks.md, "Against the machine's limits"): both are run, quote the faster.
        ("tf.data, sequential interleave", lambda: run_python(
            args.tf_python, TFDATA.replace(", num_parallel_calls=tf.data.AUTOTUNE)\n      .shuffle", ")\n      .shuffle"),
            files, {"TF_CPP_MIN_LOG_LEVEL": "2"})),
        ("Grain TFRecordIterDataset + protobuf parse", lambda: run_python(args.python, GRAIN, files)),
        ("tfrecord package, own loader", lambda: run_python(args.python, TFRECORD_PKG, files)),
        ("DataLoader + tfrecord, 0 workers", lambda: run_python(args.python, TORCH_DATALOADER.replace("WORKERS", "0"), files)),
        ("DataLoader + tfrecord, 2 workers", lambda: run_python(args.python, TORCH_DATALOADER.replace("WORKERS", "2"), files)),
    ]
    # Page the files in first: otherwise whichever contender runs first reads them from disk (on
    # 2026-12-02 that made tfpipe's first run 3x slower than its next).
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass
    rows = []
    for name, run in contenders:
        if args.only and not any(o in name for o in args.only):
            continue
        load = os.getloadavg()[0]
        r = run()
        r.update(name=name, load=round(load, 2))
        rows.append(r)
        if "error" in r:
            print(f"{name:45s} skipped: {r['error']}  (load {load:.2f})", flush=True)
        else:
            print(
                f"{name:45s} {r['examples_per_s']:>10,.0f} ex/s  first batch {r['first_batch_from_process_start_s'] * 1e3:>7.0f} ms"
                f"  ({r['examples']} examples, load {load:.2f})",
                flush=True,
            )
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
