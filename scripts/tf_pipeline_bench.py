"""tf.data's side of the pipeline benchmark in docs/benchmarks.md: read -> shuffle(10,000) ->
batch(256) -> parse (parse_example + decode_raw of `image_raw`, int64 `label`) -> prefetch, to
the end, in tf.data's fast arrangement (batch before parse; parallel reads and parse at AUTOTUNE),
with the loop inside tf.data (Dataset.reduce), so no Python runs per batch. The reads run once
with one reader and once with `num_parallel_reads=AUTOTUNE` (on 2 cores the parallel readers were
5x slower on the raw read); quote the better.

Prints examples/s for each of --repeats runs (the best is the number to quote) and the time from
the start of the first pass to its first batch. The tfpipe side is
`tfpipe bench --data PATTERN --feature image_raw:uint8:784 --feature label:int64`; run the two
alternately, on the same page-cached files.

Usage: /work/venv-tf/bin/python scripts/tf_pipeline_bench.py '/tmp/mnist500k/mnist-*.tfrecord' \
           [--batch-size 256] [--shuffle-buffer 10000] [--repeats 3]
"""
import argparse
import time

import tensorflow as tf


def dataset(files, batch_size, shuffle_buffer, readers):
    spec = {
        "image_raw": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(records):
        parsed = tf.io.parse_example(records, spec)
        return tf.io.decode_raw(parsed["image_raw"], tf.uint8), parsed["label"]

    auto = tf.data.AUTOTUNE
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=readers)
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=0)
    return ds.batch(batch_size).map(parse, num_parallel_calls=auto).prefetch(auto)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pattern")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--shuffle-buffer", type=int, default=10000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    files = sorted(tf.io.gfile.glob(args.pattern))
    if not files:
        raise SystemExit(f"no files match {args.pattern}")

    auto = tf.data.AUTOTUNE
    for readers in (None, auto):
        name = "AUTOTUNE" if readers == auto else readers
        start = time.perf_counter()
        first = next(iter(dataset(files, args.batch_size, args.shuffle_buffer, readers)))
        first_ms = (time.perf_counter() - start) * 1e3
        print(f"num_parallel_reads={name}: first batch {first_ms:.0f} ms after building the dataset "
              f"({int(tf.shape(first[0])[0])} rows)")
        count = lambda acc, batch: acc + tf.cast(tf.shape(batch[1])[0], tf.int64)  # noqa: E731
        for _ in range(args.repeats):
            ds = dataset(files, args.batch_size, args.shuffle_buffer, readers)
            start = time.perf_counter()
            examples = int(ds.reduce(tf.constant(0, tf.int64), count))
            seconds = time.perf_counter() - start
            print(f"num_parallel_reads={name}: {examples} examples in {seconds:.3f} s: "
                  f"{examples / seconds:,.0f} examples/s")


if __name__ == "__main__":
    main()
