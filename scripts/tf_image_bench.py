"""tf.data's side of the image-pipeline benchmark (docs/benchmarks.md, "Image
pipeline"): decode_and_crop_jpeg with a stateless sample_distorted_bounding_box,
resize to 224x224, random flip and normalisation, in map(AUTOTUNE), batched by
64 and prefetched, over ImageNet-style TFRecords. The Rust side is
`examples/image_pipeline.rs`.

    /work/venv-tf/bin/python scripts/tf_image_bench.py --write /tmp/imgbench   # the data (once)
    /work/venv-tf/bin/python scripts/tf_image_bench.py /tmp/imgbench           # time two epochs

`--write` makes 3,000 JPEGs of 300-600 px per side (random crops of the sample
photographs shipped by scikit-learn and scikit-image, Pillow quality 75-95) in
4 shards with `image/encoded` and `image/class/label`. `--size-range 1200 2000
--count 1000` makes the large set of docs/benchmarks.md's "DCT-scaled decoding":
sides above the smallest photo's are mosaics of random crops of at most 300 px,
so that each pixel keeps a photograph's detail (an upscaled crop would be
smoother, and cheaper to decode, than a camera's picture). `--progressive`
writes progressive JPEGs (Pillow's `progressive=True`) instead of baseline, and
`--subsampling 4:2:2` (or `4:4:4`) another chroma subsampling than Pillow's 4:2:0.
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


def mosaic(sources, rng, h, w, cell=300):
    """An h x w picture tiled with random crops of the photographs, each at
    most `cell` px per side (every source is at least 300 px per side)."""
    out = np.zeros((h, w, 3), np.uint8)
    ys = [h * i // -(-h // cell) for i in range(-(-h // cell) + 1)]
    xs = [w * j // -(-w // cell) for j in range(-(-w // cell) + 1)]
    for y0, y1 in zip(ys, ys[1:]):
        for x0, x1 in zip(xs, xs[1:]):
            photo = sources[rng.randrange(len(sources))]
            top = rng.randint(0, photo.shape[0] - (y1 - y0))
            left = rng.randint(0, photo.shape[1] - (x1 - x0))
            out[y0:y1, x0:x1] = photo[top : top + y1 - y0, left : left + x1 - x0]
    return out


SUBSAMPLING = {"4:4:4": 0, "4:2:2": 1, "4:2:0": 2}


def write(directory, count=3000, shards=4, size_range=(300, 600), progressive=False, subsampling="4:2:0"):
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
        low, high = size_range
        if high <= 600:
            ch = rng.randint(min(low, h), min(high, h))
            cw = rng.randint(min(low, w), min(high, w))
            top, left = rng.randint(0, h - ch), rng.randint(0, w - cw)
            pixels = photo[top : top + ch, left : left + cw]
        else:
            pixels = mosaic(sources, rng, rng.randint(low, high), rng.randint(low, high))
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(
            buffer,
            "JPEG",
            quality=rng.randint(75, 95),
            progressive=progressive,
            subsampling=SUBSAMPLING[subsampling],
        )
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
    parser.add_argument("--count", type=int, default=3000, help="with --write: how many JPEGs")
    parser.add_argument(
        "--size-range", type=int, nargs=2, default=(300, 600), metavar=("MIN", "MAX"), help="with --write: px per side"
    )
    parser.add_argument("--progressive", action="store_true", help="with --write: progressive JPEGs")
    parser.add_argument(
        "--subsampling", choices=sorted(SUBSAMPLING), default="4:2:0", help="with --write: chroma subsampling"
    )
    args = parser.parse_args()
    if args.write:
        write(
            args.directory,
            count=args.count,
            size_range=tuple(args.size_range),
            progressive=args.progressive,
            subsampling=args.subsampling,
        )
    else:
        run(args.directory, args.epochs)


if __name__ == "__main__":
    main()
