"""Golden values of full-size JPEG decoding for the test JPEGs that
scripts/tf_images.py's expected.json does not decode at full size (a
restart-marker file, a 4:2:2 one, TensorFlow's progressive ones), and for a
photo of a realistic size: `tf.io.decode_jpeg(bytes, channels=C)` (libjpeg-
turbo) written to testdata/images/full_tf.bin.gz as the raw uint8 pixels of
each case, row-major [H, W, C], gzip-compressed, and described in
testdata/images/full_tf.json (file, channels, offset into the uncompressed
.bin, shape; the layout of expected.json). src/image/tf_tests.rs's
`full_size_decoding_matches_tensorflow` reads both.

It first writes the photo, `photo_tf_320x240.jpg`: TensorFlow's
`encode_jpeg` (baseline, 4:2:0, quality 85) of the top-left 320x240 pixels
of scikit-learn's `china.jpg`.

    /work/venv-tf/bin/python scripts/tf_images_full.py
"""

import tensorflow as tf
from sklearn.datasets import load_sample_image

import jpeg_goldens

FILES = [
    ("china_q85_restart.jpg", [1, 3]),
    ("flower_q90_422.jpg", [1, 3]),
    ("photo_tf_progressive.jpg", [1, 3]),
    ("photo_tf_progressive_444.jpg", [1, 3]),
    ("photo_tf_progressive_grey.jpg", [1, 3]),
    ("photo_tf_320x240.jpg", [3]),
]


def write_photo():
    china = load_sample_image("china.jpg")[:240, :320]
    data = tf.io.encode_jpeg(china, quality=85).numpy()
    open("testdata/images/photo_tf_320x240.jpg", "wb").write(data)


def main():
    write_photo()
    files = [(name, [{"channels": c} for c in channel_counts]) for name, channel_counts in FILES]
    blob, cases = jpeg_goldens.decode_cases(files)
    jpeg_goldens.write("full_tf", blob, cases, compress=True)


if __name__ == "__main__":
    main()
