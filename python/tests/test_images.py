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


def test_image_spec_builds_the_spec_text():
    assert tfpipe.image_spec("image", 28, channels=1) == "image:image:28x28x1"
    spec = tfpipe.image_spec("image/encoded", (224, 160), crop="random", flip=True, normalize="imagenet", layout="NCHW")
    assert spec == "image/encoded:image:224x160x3:random_crop,imagenet,nchw,flip"
    spec = tfpipe.image_spec("x", 8, crop="center", method="area", normalize=([0.5] * 3, [0.25] * 3), brightness=0.1, contrast=(0.8, 1.2))
    assert spec == "x:image:8x8x3:center,area,normalize(0.5,0.5,0.5,0.25,0.25,0.25),brightness(0.1),contrast(0.8,1.2)"
    tfpipe.Schema([spec])  # the engine accepts what it writes
    with pytest.raises(ValueError):
        tfpipe.image_spec("x", 8, crop="middle")


def test_random_crops_and_flips_follow_the_seed_and_resume_exactly(tmp_path):
    jpeg = (IMAGES / "china_q90.jpg").read_bytes()
    path = _write(tmp_path / "photos.tfrecord", [jpeg] * 7)
    spec = tfpipe.image_spec("image", 8, crop="random", flip=True, saturation=(0.5, 1.5), normalize="unit", layout="NCHW")

    def dataset(seed, threads=2):
        return tfpipe.Dataset.tfrecord(path).batch(3).parse([spec], num_parallel_calls=threads, seed=seed).repeat(2)

    full = [b["image"] for b in dataset(5)]
    assert [x.shape for x in full[:3]] == [(3, 3, 8, 8), (3, 3, 8, 8), (1, 3, 8, 8)]
    assert full[0].dtype == np.float32 and 0 <= full[0].min() <= full[0].max() <= 1
    one_thread = [b["image"] for b in dataset(5, threads=1)]
    assert len(one_thread) == len(full) and all((a == b).all() for a, b in zip(full, one_thread))
    assert not (full[0] == next(iter(dataset(6)))["image"]).all()
    assert not (full[0][0] == full[0][1]).all(), "the same JPEG, drawn per record"
    assert not (full[0] == full[3]).all(), "each epoch draws anew"
    for cut in range(len(full) + 1):
        it = iter(dataset(5))
        head = [next(it)["image"] for _ in range(cut)]
        rest = [b["image"] for b in dataset(5).iter(state=it.get_state())]
        assert all((a == b).all() for a, b in zip(head + rest, full)) and len(head + rest) == len(full), cut
