#!/usr/bin/env python3
"""TensorFlow's raw TFRecord read (CRC checks on, no parsing), the reference for `tfpipe inspect`.

Reads every record of FILES with `tf.data.TFRecordDataset`, once with one reader
(`num_parallel_reads=None`) and once with one per file, counting them in batches of 1,024
inside the graph (`Dataset.reduce`), so no Python runs per record. Prints records and the wall
time of the read alone for each (the import is timed apart; quote the better one: on 2 cores the
parallel readers are the slower). Run it after one warm-up pass so both sides read from the page
cache:

    python scripts/tf_raw_read.py FILE...
"""
import sys
import time

t0 = time.perf_counter()
import tensorflow as tf  # noqa: E402

files = sys.argv[1:]
if not files:
    sys.exit(__doc__)
t1 = time.perf_counter()
print(f"import {t1 - t0:.2f} s")
for readers in (None, len(files)):
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=readers).batch(1024)
    start = time.perf_counter()
    records = int(ds.reduce(tf.constant(0, tf.int64),
                            lambda n, batch: n + tf.cast(tf.shape(batch)[0], tf.int64)))
    seconds = time.perf_counter() - start
    print(f"num_parallel_reads={readers}: {records} records in {seconds:.3f} s")
