"""Golden values of DCT-scaled JPEG decoding (docs/images.md, "DCT-scaled
decoding"): `tf.io.decode_jpeg(bytes, channels=C, ratio=R)` (libjpeg-turbo's
reduced IDCT) of test JPEGs at R = 2, 4, 8, written to
testdata/images/scaled_tf.bin as the raw uint8 pixels of each (file, ratio),
row-major [H, W, C], H and W = ceil(size / R), and described case by case in
testdata/images/scaled_tf.json (file, channels, ratio, offset into the .bin,
shape; the layout of scripts/tf_images.py's expected.json).
src/image/jpeg.rs's `scaled_decoding_matches_tensorflow` reads both.

It first writes the three progressive photo JPEGs it uses (TensorFlow's
`encode_jpeg(progressive=True)` of a crop of the last photo in
testdata/images/photos-imagenet.tfrecord, 47x45 pixels: 4:2:0 and 4:4:4 colour, and grey), so
that progressive decoding is checked on an encoder other than PIL's too.

    /work/venv-tf/bin/python scripts/tf_images_scaled.py
"""

import tensorflow as tf

import jpeg_goldens

FILES = [
    ("china_q90.jpg", 3),
    ("china_tf_q80.jpg", 3),
    ("flower_q75_444.jpg", 3),
    ("flower_q90_422.jpg", 3),
    ("flower_grey.jpg", 1),
    ("china_q50_progressive.jpg", 3),
    ("flower_q95_progressive.jpg", 3),
    ("photo_tf_progressive.jpg", 3),
    ("photo_tf_progressive_grey.jpg", 1),
    ("photo_tf_progressive_444.jpg", 3),
]
RATIOS = [2, 4, 8]


def write_progressive_photos():
    records = list(tf.data.TFRecordDataset("testdata/images/photos-imagenet.tfrecord"))
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string)}
    encoded = tf.io.parse_single_example(records[-1], spec)["image/encoded"]
    crop = tf.io.decode_jpeg(encoded, channels=3)[:45, :47]
    grey = tf.image.rgb_to_grayscale(crop)
    made = [("photo_tf_progressive.jpg", crop, True), ("photo_tf_progressive_grey.jpg", grey, True),
            ("photo_tf_progressive_444.jpg", crop, False)]
    for name, image, subsampled in made:
        data = tf.io.encode_jpeg(image, quality=85, progressive=True, chroma_downsampling=subsampled).numpy()
        open(f"testdata/images/{name}", "wb").write(data)


def main():
    write_progressive_photos()
    files = [(name, [{"channels": channels, "ratio": ratio} for ratio in RATIOS]) for name, channels in FILES]
    blob, cases = jpeg_goldens.decode_cases(files)
    jpeg_goldens.write("scaled_tf", blob, cases, compress=False)


if __name__ == "__main__":
    main()
