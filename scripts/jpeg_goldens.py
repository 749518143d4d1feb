"""What scripts/tf_images_scaled.py and scripts/tf_images_full.py share:
TensorFlow's `decode_jpeg` of test JPEGs case by case into one blob of raw
uint8 pixels (row-major [H, W, C]), and the writing of that blob and of its
cases (file, the decode's arguments, offset into the blob, shape) to
testdata/images/STEM.bin[.gz] and STEM.json, the layout of
scripts/tf_images.py's expected.json.
"""

import gzip
import json

import tensorflow as tf


def decode_cases(files):
    """files: [(name, [decode_jpeg keyword arguments, ...])] -> (blob, cases)."""
    blob, cases = bytearray(), []
    for name, variants in files:
        data = open(f"testdata/images/{name}", "rb").read()
        for arguments in variants:
            pixels = tf.io.decode_jpeg(data, **arguments).numpy()
            print(name, arguments, pixels.shape)
            cases.append({"file": name, **arguments, "offset": len(blob), "shape": list(pixels.shape)})
            blob += pixels.tobytes()
    return blob, cases


def write(stem, blob, cases, compress):
    """The blob (gzip-compressed, reproducibly, if `compress`) and its cases."""
    if compress:
        with gzip.GzipFile(f"testdata/images/{stem}.bin.gz", "wb", mtime=0) as f:
            f.write(bytes(blob))
    else:
        open(f"testdata/images/{stem}.bin", "wb").write(bytes(blob))
    with open(f"testdata/images/{stem}.json", "w") as f:
        json.dump({"tensorflow": tf.__version__, "cases": cases}, f, indent=1)
        f.write("\n")
