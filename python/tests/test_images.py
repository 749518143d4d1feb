"""Image features through the spec: encoded PNG/JPEG bytes decoded in the
parallel parse stage into uint8 or float32 arrays (docs/images.md)."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

import tfpipe
from conftest import REPO

IMAGES = REPO / "testdata" / "images"


def _digit() -> np.ndarray:
    with gzip.open(REPO / "testdata" / "mnist" / "train-images-idx3-ubyte.gz") as f:
        data = f.read()
    return np.frombuffer(data[16 : 16 + 784], np.uint8).reshape(28, 28, 1)


def _write(path, images):
    with tfpipe.TFRecordWriter(path) as w:
        for i, image in enumerate(images):
            w.write(tfpipe.encode_example({"image": [image], "label": i}))
    return str(path)


def test_png_digits_decode_to_uint8_pixels(tmp_path):
    png = (IMAGES / "digit.png").read_bytes()
    path = _write(tmp_path / "digits.tfrecord", [png] * 5)
    batch = next(iter(tfpipe.Dataset.tfrecord(path).batch(8).parse(["image:image:28x28x1", "label:int64"])))
    assert batch["image"].shape == (5, 28, 28, 1) and batch["image"].dtype == np.uint8
    assert (batch["image"] == _digit()).all()


def test_jpeg_to_normalised_nchw_float32(tmp_path):
    jpeg = (IMAGES / "china_q90.jpg").read_bytes()
    path = _write(tmp_path / "photos.tfrecord", [jpeg] * 3)
    ds = tfpipe.Dataset.tfrecord(path).batch(3).parse(["image:image:16x16x3:center,imagenet,nchw"])
    x = next(iter(ds))["image"]
    assert x.shape == (3, 3, 16, 16) and x.dtype == np.float32
    assert -2.2 < x.min() < x.max() < 2.7


def test_a_corrupt_image_names_its_record_and_feature(tmp_path):
    png = (IMAGES / "digit.png").read_bytes()
    path = _write(tmp_path / "bad.tfrecord", [png, png[:100], png])
    with pytest.raises(tfpipe.DataError) as error:
        list(tfpipe.Dataset.tfrecord(path).batch(3).parse(["image:image:28x28x1"]))
    text = str(error.value)
    assert "record 1 at byte" in text and 'feature "image": cannot decode the image' in text
    rows = sum(len(b["image"]) for b in tfpipe.Dataset.tfrecord(path).batch(3).parse(["image:image:28x28x1"]).ignore_errors())
    assert rows == 2
