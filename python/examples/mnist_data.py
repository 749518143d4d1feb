"""The bundled MNIST digits (testdata/mnist) as TFRecord files, for the examples.

Writes `train-0000{0..3}.tfrecord` and `test-00000.tfrecord` (features
`image_raw` 784 raw bytes and `label` int64, as `tfpipe convert idx` writes)
into a directory, once.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

import tfpipe

MNIST = Path(__file__).resolve().parents[2] / "testdata" / "mnist"
SCHEMA = tfpipe.Schema(["image_raw:uint8:28x28", "label:int64"], label="label")


def _idx(name: str, header: int) -> np.ndarray:
    return np.frombuffer(gzip.open(MNIST / name).read()[header:], np.uint8)


def write(directory: str) -> str:
    """Writes the TFRecord files (if absent) and returns their glob for the training split."""
    os.makedirs(directory, exist_ok=True)
    for split, shards in (("train", 4), ("test", 1)):
        images = _idx(f"{split}-images-idx3-ubyte.gz", 16).reshape(-1, 784)
        labels = _idx(f"{split}-labels-idx1-ubyte.gz", 8)
        for s in range(shards):
            path = Path(directory) / f"{split}-{s:05d}.tfrecord"
            if path.exists():
                continue
            with tfpipe.TFRecordWriter(path) as w:
                for i in range(s, len(labels), shards):
                    w.write(tfpipe.encode_example({"image_raw": images[i].tobytes(), "label": int(labels[i])}))
    return str(Path(directory) / "train-*.tfrecord")
