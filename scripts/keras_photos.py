#!/usr/bin/env python3
"""End-to-end augmented photo training, Keras + tf.data's side (issue 20): the
CNN of tfpipe's built-in `--model cnn` at 64x64x3 (scripts/keras_lenet.py's
layers: conv 5x5 (6, same) -> pool 2 -> conv 5x5 (16, valid) -> pool 2 ->
120 -> 84 -> classes), trained by Keras fit() on ImageNet-style JPEG
TFRecords (`image/encoded`, `image/class/label`) fed by tf.data:

    TFRecordDataset(train files).shuffle(10000, seed)
      .map(parse; extract_jpeg_shape; sample_distorted_bounding_box (area 0.08-1,
           aspect 3/4-4/3, min_object_covered 0.1, 10 attempts); decode_and_crop_jpeg;
           resize 64x64 bilinear; random_flip_left_right; /255 -> float32, AUTOTUNE)
      .batch(64).prefetch(AUTOTUNE)

with Adam 1e-3 and sparse softmax cross-entropy on logits, and the validation
files through the same map (tfpipe's validation pass uses the training spec,
random crop and flip included, drawn as epoch 0; docs/images.md), so both
sides are scored on the same kind of input. tfpipe's side of the comparison:

    tfpipe train --data 'DIR/shard-0[0-2].tfrecord' --validation-data DIR/shard-03.tfrecord \\
        --feature 'image/encoded:image:64x64x3:random_crop,flip,float32' \\
        --feature image/class/label:int64 --label image/class/label \\
        --batch-size 64 --epochs 5 --optimizer adam --seed 1 --report-json R.json

Make the data with `python scripts/tf_image_bench.py --write DIR` (3,000 JPEGs
of 300-600 px cut from 9 sample photos, the label the source photo; 4 shards).

Prints one JSON line: images trained, fit wall time (validation included),
the training images/s of the whole fit (validation passes left out) and of
the steady state (the median epoch after the first), the fit() call to the
end of the first step, process start to the end of the first step, and the
validation accuracy after each epoch.

Usage (repository root): /work/venv-tf/bin/python scripts/keras_photos.py DIR
[--epochs 5] [--batch-size 64] [--size 64] [--seed 1]
"""
import argparse
import glob
import json
import os
import time

T0 = time.perf_counter()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402
from keras_lenet import lenet  # noqa: E402  (this directory: scripts/)

SPEC = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}


def cnn(size, classes):
    """tfpipe's `--model cnn` at `size`x`size`x3."""
    return lenet(shape=(size, size, 3), classes=classes)


def preprocess(size):
    def go(record):
        parsed = tf.io.parse_single_example(record, SPEC)
        jpeg = parsed["image/encoded"]
        begin, crop, _ = tf.image.sample_distorted_bounding_box(
            tf.io.extract_jpeg_shape(jpeg),
            bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
            min_object_covered=0.1,
            aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(0.08, 1.0),
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        y, x, _ = tf.unstack(begin)
        h, w, _ = tf.unstack(crop)
        image = tf.io.decode_and_crop_jpeg(jpeg, tf.stack([y, x, h, w]), channels=3)
        image = tf.image.resize(image, [size, size])
        image = tf.image.random_flip_left_right(image)
        return image / 255.0, parsed["image/class/label"]

    return go


def dataset(files, size, batch, shuffle_seed=None):
    ds = tf.data.TFRecordDataset(files)
    if shuffle_seed is not None:
        ds = ds.shuffle(10000, seed=shuffle_seed)
    ds = ds.map(preprocess(size), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch).prefetch(tf.data.AUTOTUNE)


class Clock(keras.callbacks.Callback):
    """Each epoch's training time (its start to its validation pass), the
    validation passes' time, and the end of the first step."""

    def __init__(self):
        super().__init__()
        self.train_s, self.val_s, self.first_step = [], [], None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self.first_step is None:
            self.first_step = time.perf_counter()

    def on_test_begin(self, logs=None):
        now = time.perf_counter()
        self.train_s.append(now - self.epoch_start)
        self.test_start = now

    def on_test_end(self, logs=None):
        self.val_s.append(time.perf_counter() - self.test_start)


def count(files):
    return sum(1 for _ in tf.data.TFRecordDataset(files))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("directory")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    shards = sorted(glob.glob(os.path.join(args.directory, "shard-*.tfrecord")))
    if len(shards) < 2:
        raise SystemExit(f"{args.directory}: expected the shards of tf_image_bench.py --write")
    train_files, validation_files = shards[:-1], shards[-1:]
    keras.utils.set_random_seed(args.seed)
    train = dataset(train_files, args.size, args.batch_size, shuffle_seed=args.seed)
    validation = dataset(validation_files, args.size, args.batch_size)
    model = cnn(args.size, classes=9)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    clock = Clock()
    fit_start = time.perf_counter()
    history = model.fit(train, validation_data=validation, epochs=args.epochs, verbose=0,
                        callbacks=[clock])
    fit_s = time.perf_counter() - fit_start
    # Counted after the fit, so that reading the files does not warm the page cache for it.
    images = count(train_files) * args.epochs
    per_epoch = images / args.epochs
    steady = float(np.median(clock.train_s[1:] or clock.train_s))
    print(json.dumps({
        "side": "keras",
        "images": images,
        "fit_s": round(fit_s, 3),
        "images_per_s": round(images / (fit_s - sum(clock.val_s))),
        "steady_images_per_s": round(per_epoch / steady),
        "fit_to_first_step_s": round(clock.first_step - fit_start, 3),
        "process_to_first_step_s": round(clock.first_step - T0, 3),
        "val_accuracy": [round(a * 100, 2) for a in history.history["val_accuracy"]],
        "accuracy": [round(a * 100, 2) for a in history.history["accuracy"]],
    }), flush=True)


if __name__ == "__main__":
    main()
