#!/usr/bin/env python3
"""The Keras side of `cargo run --release --example cnn_step`: the same LeNet-like CNN
(scripts/keras_lenet.py) at any image size, trained by Keras fit() on one batch held in memory
(tf.data `from_tensors(...).repeat()`, so no input pipeline), Adam 1e-3, softmax
cross-entropy from logits, no metrics.

Prints one JSON line, as the Rust example does: median and 10th/90th percentile step in ms (the
first 10 steps left out; a step is the time between Keras's batch-end callbacks) and the
process's CPU time per image over the timed steps.

Needs TensorFlow: python3 -m venv VENV && VENV/bin/pip install tensorflow-cpu==2.21.0
Usage: VENV/bin/python scripts/keras_cnn_step.py [HxWxC] [BATCH] [STEPS] [CLASSES]
"""
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from keras_lenet import lenet  # noqa: E402

WARM_UP = 10
args = sys.argv[1:]
h, w, c = (int(s) for s in (args[0] if args else "64x64x3").split("x"))
rows = int(args[1]) if len(args) > 1 else 64
steps = int(args[2]) if len(args) > 2 else 100
classes = int(args[3]) if len(args) > 3 else 9

rng = np.random.default_rng(7)
x = rng.integers(0, 256, size=(rows, h, w, c), dtype=np.uint8).astype(np.float32) / 255.0
y = rng.integers(0, classes, size=(rows,), dtype=np.int64)
ds = tf.data.Dataset.from_tensors((x, y)).repeat(WARM_UP + steps + 1)

keras.utils.set_random_seed(0)
model = lenet((h, w, c), classes)
model.compile(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
stamps = []
cpu = []


class Stamp(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        stamps.append(time.perf_counter())
        if len(stamps) in (WARM_UP + 1, WARM_UP + steps + 1):
            cpu.append(time.process_time())


model.fit(ds, epochs=1, verbose=0, callbacks=[Stamp()])
times = np.diff(np.array(stamps))[WARM_UP:] * 1e3
print(json.dumps({
    "image": f"{h}x{w}x{c}",
    "batch": rows,
    "steps": len(times),
    "median_step_ms": round(float(np.median(times)), 3),
    "p10_step_ms": round(float(np.percentile(times, 10)), 3),
    "p90_step_ms": round(float(np.percentile(times, 90)), 3),
    "cpu_per_image_ms": round((cpu[1] - cpu[0]) * 1e3 / (len(times) * rows), 4),
}))
