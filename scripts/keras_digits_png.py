#!/usr/bin/env python3
"""The digits PNG accuracy check of issue 20: MNIST digits as PNG in TFDS's
layout (`image`, `label`), written by TensorFlow, trained by Keras's LeNet-like
CNN (the model of tfpipe's `--model cnn`, as scripts/keras_cnn.py) fed by
tf.data with `decode_png`, and the test accuracy after each epoch.

Writes DIR/digits-train.tfrecord and DIR/digits-test.tfrecord from
testdata/mnist (its 8,000 / 2,000 split; `tf.io.encode_png`,
`tf.io.TFRecordWriter`), then trains once per seed and prints one JSON line
per seed. tfpipe trains on the same two files with (docs/images.md):

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


def train(out, epochs, seed):
    keras.utils.set_random_seed(seed)
    model = lenet()
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(dataset(os.path.join(out, "digits-train.tfrecord"), True, seed),
                        validation_data=dataset(os.path.join(out, "digits-test.tfrecord"), False, seed),
                        epochs=epochs, verbose=0)
    return [round(a * 100, 2) for a in history.history["val_accuracy"]]


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
        print(json.dumps({"seed": seed, "val_accuracy_per_epoch": train(args.out, args.epochs, seed)}), flush=True)


if __name__ == "__main__":
    main()
