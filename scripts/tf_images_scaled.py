"""Golden values of DCT-scaled JPEG decoding (docs/images.md, "DCT-scaled
decoding"): `tf.io.decode_jpeg(bytes, channels=C, ratio=R)` (libjpeg-turbo's
reduced IDCT) of test JPEGs at R = 2, 4, 8, written to
testdata/images/scaled_tf.bin as the raw uint8 pixels of each (file, ratio) in
the order of FILES and RATIOS, row-major [H, W, C], H and W = ceil(size / R).
src/image/jpeg.rs's `scaled_decoding_matches_tensorflow` reads it.

    /work/venv-tf/bin/python scripts/tf_images_scaled.py
"""

import tensorflow as tf

FILES = [("china_q90.jpg", 3), ("china_tf_q80.jpg", 3), ("flower_q75_444.jpg", 3), ("flower_grey.jpg", 1)]
RATIOS = [2, 4, 8]


def main():
    out = bytearray()
    for name, channels in FILES:
        data = open(f"testdata/images/{name}", "rb").read()
        for ratio in RATIOS:
            pixels = tf.io.decode_jpeg(data, channels=channels, ratio=ratio).numpy()
            print(name, ratio, pixels.shape)
            out += pixels.tobytes()
    open("testdata/images/scaled_tf.bin", "wb").write(bytes(out))


if __name__ == "__main__":
    main()
