"""tf.data's side of the sequence benchmark in docs/benchmarks.md: padded batch
and bucket_by_sequence_length over the token set (`tfpipe demo --tokens`), in the
arrangement tfpipe uses (batch the records, parse per batch, regroup the rows),
reporting examples/s and the padding fraction (pad tokens over all tokens), once
with the loop inside tf.data (Dataset.reduce) and once iterating in Python with
.numpy() per batch, as a training loop would.

Usage: /work/venv-tf/bin/python scripts/tf_sequences_bench.py 'DIR/tokens-train-*.tfrecord' \
           [--batch-size 32] [--boundaries 12,16,20,24,28] [--repeats 3]
"""
import argparse
import json
import time

import tensorflow as tf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pattern")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--boundaries", default="12,16,20,24,28")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    boundaries = [int(b) for b in args.boundaries.split(",")]
    spec = {"tokens": tf.io.VarLenFeature(tf.int64), "label": tf.io.FixedLenFeature([], tf.int64)}
    files = sorted(tf.io.gfile.glob(args.pattern))

    def rows():
        def parse(records):
            parsed = tf.io.parse_example(records, spec)
            tokens = tf.RaggedTensor.from_sparse(parsed["tokens"])
            return {"tokens": tokens, "label": parsed["label"]}

        ds = tf.data.TFRecordDataset(files).batch(256).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.unbatch().map(lambda x: {"tokens": x["tokens"], "label": x["label"],
                                         "n": tf.shape(x["tokens"])[0]})
        return ds

    modes = {
        "padded_batch": lambda ds: ds.padded_batch(args.batch_size),
        "bucket_by_sequence_length": lambda ds: ds.bucket_by_sequence_length(
            lambda x: x["n"], boundaries, [args.batch_size] * (len(boundaries) + 1)),
    }
    def stats(b):
        return (tf.shape(b["n"], out_type=tf.int64)[0], tf.reduce_sum(tf.cast(b["n"], tf.int64)),
                tf.cast(tf.shape(b["tokens"])[0] * tf.shape(b["tokens"])[1], tf.int64))

    zero = (tf.constant(0, tf.int64),) * 3
    add = lambda acc, x: tuple(a + b for a, b in zip(acc, x))
    for name, regroup in modes.items():
        # The whole loop inside tf.data (Dataset.reduce): no Python per batch.
        best = None
        for _ in range(args.repeats):
            ds = regroup(rows()).map(stats)
            start = time.perf_counter()
            examples, real, cells = [int(x) for x in ds.reduce(zero, add)]
            seconds = time.perf_counter() - start
            if best is None or seconds < best[0]:
                best = (seconds, examples, real, cells)
        seconds, examples, real, cells = best
        print(json.dumps({"mode": name, "loop": "Dataset.reduce", "examples": examples,
                          "seconds": round(seconds, 3), "examples_per_sec": round(examples / seconds),
                          "padding_fraction": round(1 - real / cells, 4)}))
        best = None
        for _ in range(args.repeats):
            ds = regroup(rows()).prefetch(2)
            start = time.perf_counter()
            examples = real = cells = 0
            for batch in ds:
                n = batch["n"].numpy()
                examples += len(n)
                real += int(n.sum())
                cells += batch["tokens"].shape[0] * batch["tokens"].shape[1]
            seconds = time.perf_counter() - start
            if best is None or seconds < best[0]:
                best = (seconds, examples, real, cells)
        seconds, examples, real, cells = best
        print(json.dumps({"mode": name, "loop": "python, .numpy() per batch", "examples": examples, "seconds": round(seconds, 3),
                          "examples_per_sec": round(examples / seconds),
                          "padding_fraction": round(1 - real / cells, 4)}))


if __name__ == "__main__":
    main()
