#!/usr/bin/env python3
"""Side-by-side reference: Keras fit() fed by the fastest tf.data arrangement measured on 2 cores.

Trains Input(784) -> Dense(256, relu) -> Dense(10) (logits, softmax cross-entropy, Adam 1e-3,
no metrics) for --epochs on TFRecord files of tf.train.Example with `image_raw` (784 raw bytes)
and `label` (int64), read as TFRecordDataset(files) -> shuffle(10000) -> batch(B) ->
map(parse_example + decode_raw + cast/255, AUTOTUNE) -> prefetch(AUTOTUNE).
Prints one JSON line: ex_per_s (fit() call to last step), steady_ex_per_s, median_step_ms,
fit_to_first_step_s, import_s.

A copy of the shared folder's bench/keras_fit.py, kept here so that the comparison runs from a
clone (scripts/bench-vs-keras.sh uses it).

Needs TensorFlow: python3 -m venv VENV && VENV/bin/pip install tensorflow-cpu==2.21.0
Usage: VENV/bin/python scripts/keras_fit.py FILE... [--batch-size 256] [--epochs 1]
Run it in the same minute as the tfpipe command you compare with: the machine is shared, and
only the ratio of the two figures means anything.
"""
import argparse
import json
import os
import time

t0 = time.time()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import_s = time.time() - t0
ap = argparse.ArgumentParser()
ap.add_argument("files", nargs="+")
ap.add_argument("--batch-size", type=int, default=256)
ap.add_argument("--epochs", type=int, default=1)
args = ap.parse_args()

spec = {"image_raw": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}


def parse(serialized):
    f = tf.io.parse_example(serialized, spec)
    x = tf.cast(tf.io.decode_raw(f["image_raw"], tf.uint8), tf.float32) / 255.0
    return tf.reshape(x, [-1, 784]), f["label"]


ds = (tf.data.TFRecordDataset(args.files).shuffle(10000, seed=1).batch(args.batch_size)
      .map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE))
keras.utils.set_random_seed(0)
inputs = keras.Input(shape=(784,))
h = keras.layers.Dense(256, activation="relu")(inputs)
model = keras.Model(inputs, keras.layers.Dense(10)(h))
model.compile(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
stamps = []


class Stamp(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        stamps.append(time.perf_counter())


t_fit = time.perf_counter()
model.fit(ds, epochs=args.epochs, verbose=0, callbacks=[Stamp()])
steps = np.diff(np.array(stamps))[9:]
examples = len(stamps) * args.batch_size
print(json.dumps({
    "ex_per_s": examples / (stamps[-1] - t_fit),
    "steady_ex_per_s": (examples - args.batch_size) / (stamps[-1] - stamps[0]),
    "median_step_ms": float(np.median(steps)) * 1e3,
    "fit_to_first_step_s": stamps[0] - t_fit,
    "steps": len(stamps),
    "import_s": import_s,
}))
