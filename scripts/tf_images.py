"""Writes testdata/images/: small encoded images and TensorFlow's decoding and
resizing of them, for src/image/tf_tests.rs and the other unit tests of src/image/.

Run from the repository root with TensorFlow 2.21 CPU, Pillow and
scikit-learn (for its two sample photographs):

    /work/venv-tf/bin/python scripts/tf_images.py

Inputs are crops of scikit-learn's `china.jpg` and `flower.jpg` (re-encoded by
Pillow and by TensorFlow at several sizes and qualities, baseline and
progressive, 4:2:0 and 4:4:4) and MNIST digits from testdata/mnist. Outputs:

- `testdata/images/*.{jpg,png,gif,bmp}`: the encoded images;
- `testdata/images/expected.json`: one case per (file, channels) with the
  shape of `tf.io.decode_image(data, channels, expand_animations=False)`, and
  one case per resize (file, method, antialias, size) with the shape of
  `tf.image.resize` of the decoded RGB image;
- `testdata/images/expected.bin.gz`: the values of every case, one after
  another at the offsets in the JSON (decodes as uint8, resizes as
  little-endian float32);
- `testdata/images/digits-tfds.tfrecord`: 120 MNIST digits as PNG in TFDS's
  layout (`image`, `label`), written by `tf.io.TFRecordWriter`;
- `testdata/images/photos-imagenet.tfrecord`: 6 JPEG crops in the layout of
  tensorflow/models' `build_imagenet_data.py` (`image/encoded`,
  `image/class/label`, `image/height`, `image/width`, `image/format`, ...).
"""

import gzip
import io
import json
import os

import numpy as np
import tensorflow as tf
from PIL import Image
from sklearn.datasets import load_sample_image

OUT = "testdata/images"


def crop(photo, top, left, height, width):
    return Image.fromarray(photo[top : top + height, left : left + width])


def pil_bytes(image, fmt, **kwargs):
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def mnist_digit(index):
    with gzip.open("testdata/mnist/train-images-idx3-ubyte.gz") as f:
        data = f.read()
    start = 16 + index * 784
    return np.frombuffer(data[start : start + 784], np.uint8).reshape(28, 28)


def mnist_label(index):
    with gzip.open("testdata/mnist/train-labels-idx1-ubyte.gz") as f:
        return f.read()[8 + index]


def feature(value):
    if isinstance(value, bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def write_records(path, examples):
    with tf.io.TFRecordWriter(path) as w:
        for features in examples:
            example = tf.train.Example(features=tf.train.Features(feature={k: feature(v) for k, v in features.items()}))
            w.write(example.SerializeToString())


def write_tfrecords():
    digits = [
        {"image": tf.io.encode_png(mnist_digit(i)[:, :, None]).numpy(), "label": int(mnist_label(i))} for i in range(120)
    ]
    write_records(os.path.join(OUT, "digits-tfds.tfrecord"), digits)
    china = load_sample_image("china.jpg")
    flower = load_sample_image("flower.jpg")
    photos = []
    for i in range(6):
        photo = (china, flower)[i % 2]
        top, left = 40 * i, 60 * i
        crop = photo[top : top + 36 + 4 * i, left : left + 48]
        jpeg = tf.io.encode_jpeg(crop, quality=85).numpy()
        photos.append(
            {
                "image/encoded": jpeg,
                "image/format": b"JPEG",
                "image/class/label": i % 2 + 1,
                "image/class/text": (b"china", b"flower")[i % 2],
                "image/height": crop.shape[0],
                "image/width": crop.shape[1],
            }
        )
    write_records(os.path.join(OUT, "photos-imagenet.tfrecord"), photos)


def inputs():
    china = load_sample_image("china.jpg")
    flower = load_sample_image("flower.jpg")
    a = crop(china, 120, 200, 40, 32)
    b = crop(flower, 150, 260, 29, 37)
    c = crop(china, 300, 90, 16, 24)
    rgba = np.dstack([np.asarray(c), np.linspace(0, 255, 16 * 24).astype(np.uint8).reshape(16, 24)])
    files = {
        # Pillow: baseline 4:2:0 at quality 90, progressive, 4:4:4, grey, odd sizes.
        "china_q90.jpg": pil_bytes(a, "JPEG", quality=90),
        "china_q50_progressive.jpg": pil_bytes(a, "JPEG", quality=50, progressive=True),
        "flower_q75_444.jpg": pil_bytes(b, "JPEG", quality=75, subsampling=0),
        "flower_q95_progressive.jpg": pil_bytes(b, "JPEG", quality=95, progressive=True),
        "flower_grey.jpg": pil_bytes(b.convert("L"), "JPEG", quality=85),
        # TensorFlow's own encoder (libjpeg-turbo, 4:2:0).
        "china_tf_q80.jpg": tf.io.encode_jpeg(np.asarray(c), quality=80).numpy(),
        "flower_tf_q95_444.jpg": tf.io.encode_jpeg(np.asarray(b), quality=95, chroma_downsampling=False).numpy(),
        # PNG: RGB, grey, RGBA, grey + alpha, palette; one written by TensorFlow.
        "china_rgb.png": pil_bytes(a, "PNG"),
        "flower_grey.png": pil_bytes(b.convert("L"), "PNG"),
        "china_rgba.png": pil_bytes(Image.fromarray(rgba), "PNG"),
        "flower_la.png": pil_bytes(b.convert("LA"), "PNG"),
        "china_palette.png": pil_bytes(c.convert("P", palette=Image.ADAPTIVE, colors=16), "PNG"),
        "flower_tf.png": tf.io.encode_png(np.asarray(b)).numpy(),
        "digit.png": tf.io.encode_png(mnist_digit(0)[:, :, None]).numpy(),
        # GIF (palette) and BMP (24-bit; 37 px rows are padded).
        "china.gif": pil_bytes(c.convert("P", palette=Image.ADAPTIVE, colors=32), "GIF"),
        "flower.bmp": pil_bytes(b, "BMP"),
    }
    return files


def main():
    os.makedirs(OUT, exist_ok=True)
    blob = bytearray()
    cases = []

    def add(case, array):
        case["offset"] = len(blob)
        case["shape"] = list(array.shape)
        blob.extend(array.tobytes())
        cases.append(case)

    files = inputs()
    for name, data in sorted(files.items()):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        for channels in (1, 3):
            try:
                image = tf.io.decode_image(data, channels=channels, expand_animations=False)
            except tf.errors.OpError as error:
                cases.append({"kind": "decode", "file": name, "channels": channels, "error": error.message})
                continue
            add({"kind": "decode", "file": name, "channels": channels, "dtype": "uint8"}, image.numpy())

    resizes = [
        ("china_rgb.png", (13, 17)),  # down by about 3 and 2.5
        ("china_rgb.png", (23, 19)),  # up on one axis, down on the other
        ("china_palette.png", (20, 29)),  # up
    ]
    for name, size in resizes:
        image = tf.io.decode_png(files[name], channels=3)
        for method, antialias in [("bilinear", False), ("bilinear", True), ("area", False), ("nearest", False)]:
            out = tf.image.resize(image, size, method=method, antialias=antialias)
            case = {"kind": "resize", "file": name, "method": method, "antialias": antialias, "dtype": "float32"}
            add(case, out.numpy().astype("<f4"))

    with gzip.GzipFile(os.path.join(OUT, "expected.bin.gz"), "wb", mtime=0) as f:
        f.write(bytes(blob))
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"tensorflow": tf.__version__, "cases": cases}, f, indent=1)
        f.write("\n")
    write_tfrecords()
    print(f"{len(files)} files, {len(cases)} cases, {len(blob)} bytes of expected values")


if __name__ == "__main__":
    main()
