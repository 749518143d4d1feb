"""Train a small Keras 3 model on the bundled MNIST with JAX, fed by tfpipe.

    pip install ./python grain keras jax
    KERAS_BACKEND=jax python python/examples/keras_mnist.py

`tfpipe.keras.dataset` turns the parsed batches into (x, y) tuples that
`Model.fit` accepts on any backend (it is a Grain IterDataset).
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402

import tfpipe  # noqa: E402
import tfpipe.keras  # noqa: E402
from mnist_data import SCHEMA, write  # noqa: E402


def main() -> None:
    data = write(tempfile.gettempdir() + "/tfpipe-mnist")
    train = tfpipe.Dataset.tfrecord(data).interleave(4, 16).shuffle(10_000, seed=0).batch(64).parse(SCHEMA).prefetch(2)
    test = tfpipe.Dataset.tfrecord(data.replace("train-*", "test-*")).batch(500).parse(SCHEMA)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((28, 28)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(
        tfpipe.keras.dataset(train, x="image_raw", y="label"),
        validation_data=tfpipe.keras.dataset(test, x="image_raw", y="label"),
        epochs=3,
        shuffle=False,  # the tfpipe dataset shuffles
    )


if __name__ == "__main__":
    main()
