"""tf.data's side of the image-pipeline benchmark (docs/benchmarks.md, "Image
pipeline"): decode_and_crop_jpeg with a stateless sample_distorted_bounding_box,
resize to 224x224, random flip and normalisation, in map(AUTOTUNE), batched by
64 and prefetched, over ImageNet-style TFRecords. The Rust side is
`examples/image_pipeline.rs`.

    /work/venv-tf/bin/python scripts/tf_image_bench.py --write /tmp/imgbench   # the data (once)
    /work/venv-tf/bin/python scripts/tf_image_bench.py /tmp/imgbench           # time two epochs

`--write` makes 3,000 JPEGs of 300-600 px per side (random crops of the sample
photographs shipped by scikit-learn and scikit-image, Pillow quality 75-95) in
4 shards with `image/encoded` and `image/class/label`.
"""

import argparse
import glob
import io
import os
import random
import time

import numpy as np
import tensorflow as tf

MEAN = tf.constant([0.485, 0.456, 0.406])
STD = tf.constant([0.229, 0.224, 0.225])


def photos():
    import skimage.data as data
    from sklearn.datasets import load_sample_image

    out = [load_sample_image("china.jpg"), load_sample_image("flower.jpg")]
    for name in ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "retina"]:
        out.append(getattr(data, name)())
    return out


def write(directory, count=3000, shards=4):
    # Only writing needs Pillow (and photos() scikit-learn and scikit-image):
    # timing runs in a venv with TensorFlow alone.
    from PIL import Image

    os.makedirs(directory, exist_ok=True)
    rng = random.Random(0)
    sources = photos()
    writers = [tf.io.TFRecordWriter(os.path.join(directory, f"shard-{s:02d}.tfrecord")) for s in range(shards)]
    for i in range(count):
        k = rng.randrange(len(sources))
        photo = sources[k]
        h, w = photo.shape[:2]
        ch = rng.randint(min(300, h), min(600, h))
        cw = rng.randint(min(300, w), min(600, w))
        top, left = rng.randint(0, h - ch), rng.randint(0, w - cw)
        buffer = io.BytesIO()
        Image.fromarray(photo[top : top + ch, left : left + cw]).save(buffer, "JPEG", quality=rng.randint(75, 95))
        feature = {
            "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[buffer.getvalue()])),
            "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[k])),
        }
        writers[i % shards].write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    for w in writers:
        w.close()


def preprocess(record, seed):
    parsed = tf.io.parse_single_example(
        record,
        {"image/encoded": tf.io.FixedLenFeature([], tf.string), "image/class/label": tf.io.FixedLenFeature([], tf.int64)},
    )
    jpeg = parsed["image/encoded"]
    shape = tf.io.extract_jpeg_shape(jpeg)
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
        seed=seed,
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    y, x, _ = tf.unstack(begin)
    h, w, _ = tf.unstack(size)
    image = tf.io.decode_and_crop_jpeg(jpeg, tf.stack([y, x, h, w]), channels=3)
    image = tf.image.resize(image, [224, 224])
    image = tf.image.stateless_random_flip_left_right(image, seed=seed + 1)
    image = (image / 255.0 - MEAN) / STD
    return image, parsed["image/class/label"]


def run(directory, epochs):
    files = sorted(glob.glob(os.path.join(directory, "shard-*.tfrecord")))
    for epoch in range(epochs):
        ds = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
        seeds = tf.data.Dataset.counter().map(lambda i: tf.stack([i, tf.constant(epoch, tf.int64)]))
        ds = tf.data.Dataset.zip((ds, seeds)).map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.batch(64).prefetch(tf.data.AUTOTUNE)
        start = time.perf_counter()
        images = 0
        for images_batch, _ in ds:
            images += int(images_batch.shape[0])
        seconds = time.perf_counter() - start
        print(f"epoch {epoch}: {images} images in {seconds:.2f} s: {images / seconds:.0f} images/s (tf.data AUTOTUNE)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    if args.write:
        write(args.directory)
    else:
        run(args.directory, args.epochs)


if __name__ == "__main__":
    main()
