#!/usr/bin/env python3
"""The digits PNG accuracy check of issue 20: MNIST digits as PNG in TFDS's
layout (`image`, `label`), written by TensorFlow, trained by Keras's LeNet-like
CNN (the model of tfpipe's `--model cnn`, as scripts/keras_cnn.py) fed by
tf.data with `decode_png`, and the test accuracy after each epoch.

Writes DIR/digits-train.tfrecord and DIR/digits-test.tfrecord from
testdata/mnist (its 8,000 / 2,000 split; `tf.io.encode_png`,
`tf.io.TFRecordWriter`), then trains once per seed and prints one JSON line
per seed: the test accuracy after each epoch, the fit's wall time and each
epoch's training time without its validation pass (decode + step: the end-to-end
image training rate). tfpipe trains on the same two files with (docs/images.md):

    tfpipe train --data DIR/digits-train.tfrecord --validation-data DIR/digits-test.tfrecord \\
        --feature image:image:28x28x1 --feature label:int64 --label label \\
        --batch-size 64 --epochs 5 --optimizer adam --rescale

Run from the repository root: /work/venv-tf/bin/python scripts/keras_digits_png.py DIR
[--epochs 5] [--seeds 0,1,2] [--write-only]
"""
import argparse
import gzip
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402
from keras_lenet import lenet  # noqa: E402  (this directory: scripts/)


def idx(path, header):
    with gzip.open(path) as f:
        return np.frombuffer(f.read()[header:], np.uint8)


def write(path, images, labels):
    with tf.io.TFRecordWriter(path) as w:
        for image, label in zip(images, labels):
            png = tf.io.encode_png(image[:, :, None]).numpy()
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[png])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
            }
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def write_files(out):
    os.makedirs(out, exist_ok=True)
    for split in ("train", "test"):
        images = idx(f"testdata/mnist/{split}-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
        labels = idx(f"testdata/mnist/{split}-labels-idx1-ubyte.gz", 8)
        write(os.path.join(out, f"digits-{split}.tfrecord"), images, labels)


TRAIN_RECORDS = 8000  # testdata/mnist's train split, as write_files writes it
spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}


def parse(serialized):
    f = tf.io.parse_single_example(serialized, spec)
    x = tf.cast(tf.io.decode_png(f["image"], channels=1), tf.float32) / 255.0
    return tf.reshape(x, [28, 28, 1]), f["label"]


def dataset(path, shuffle, seed):
    ds = tf.data.TFRecordDataset(path)
    if shuffle:
        ds = ds.shuffle(10000, seed=seed)
    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(64).prefetch(tf.data.AUTOTUNE)


class EpochTimes(keras.callbacks.Callback):
    """Wall time of each epoch's training part: from the epoch's start to the
    start of its validation pass, so that the figure is decode + augment +
    step, comparable with tfpipe's `train ... examples/s` per epoch."""

    def __init__(self):
        super().__init__()
        self.train_s = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()
        self.done = False

    def on_test_begin(self, logs=None):
        if not self.done:
            self.train_s.append(time.perf_counter() - self.start)
            self.done = True


def train(out, epochs, seed):
    keras.utils.set_random_seed(seed)
    model = lenet()
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    times = EpochTimes()
    fit_start = time.perf_counter()
    history = model.fit(dataset(os.path.join(out, "digits-train.tfrecord"), True, seed),
                        validation_data=dataset(os.path.join(out, "digits-test.tfrecord"), False, seed),
                        epochs=epochs, verbose=0, callbacks=[times])
    fit_s = time.perf_counter() - fit_start
    steady = sorted(times.train_s[1:]) or times.train_s
    return {
        "val_accuracy_per_epoch": [round(a * 100, 2) for a in history.history["val_accuracy"]],
        "fit_s": round(fit_s, 3),
        "epoch_train_s": [round(t, 3) for t in times.train_s],
        # Epochs after the first (which traces the graph): the steady rate.
        "train_images_per_s_median": round(TRAIN_RECORDS / steady[len(steady) // 2]),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--write-only", action="store_true")
    args = ap.parse_args()
    write_files(args.out)
    if args.write_only:
        return
    for seed in (int(s) for s in args.seeds.split(",")):
        print(json.dumps({"seed": seed, **train(args.out, args.epochs, seed)}), flush=True)


if __name__ == "__main__":
    main()
