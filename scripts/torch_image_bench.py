"""PyTorch's side of the image-pipeline benchmark (docs/benchmarks.md,
"Images"): the ImageNet training transform as PyTorch users write it, over the
same ImageNet-style TFRecords as `examples/image_pipeline.rs` and
`scripts/tf_image_bench.py`.

Each record is decoded, cropped by `RandomResizedCrop(224, scale=(0.08, 1),
ratio=(3/4, 4/3))` (torchvision's form of sample_distorted_bounding_box),
flipped at random, turned to float32 and normalised with ImageNet's mean and
std, in `DataLoader` worker processes, batched by 64. Two decoders:

- `pil`: `PIL.Image.open(...).convert("RGB")` and the transforms on the PIL
  image (torchvision's reference ImageNet recipe);
- `tv`: `torchvision.io.decode_jpeg` (libjpeg-turbo) and `transforms.v2` on
  uint8 tensors.

The records are read by the `tfrecord` package's `tfrecord_iterator` (CRCs
not checked) and parsed by its `protobuf` message, each worker reading its own
shards, as a careful PyTorch user would (the package's own dataset gives every
worker every record unless an index is built).

    pip install torch torchvision pillow tfrecord
    python scripts/torch_image_bench.py /tmp/imgbench --decoder pil --workers 2 --epochs 2
"""

import argparse
import glob
import io
import os
import time

import torch
from PIL import Image
from tfrecord import example_pb2
from tfrecord.reader import tfrecord_iterator
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchvision import io as tvio
from torchvision import transforms as T
from torchvision.transforms import v2

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def example(record):
    parsed = example_pb2.Example()
    parsed.ParseFromString(record)
    feature = parsed.features.feature
    return feature["image/encoded"].bytes_list.value[0], feature["image/class/label"].int64_list.value[0]


def pil_transform():
    augment = T.Compose(
        [
            T.RandomResizedCrop(224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(MEAN, STD),
        ]
    )
    return lambda jpeg: augment(Image.open(io.BytesIO(jpeg)).convert("RGB"))


def tv_transform():
    augment = v2.Compose(
        [
            v2.RandomResizedCrop(224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )

    def decode(jpeg):
        pixels = tvio.decode_jpeg(torch.frombuffer(bytearray(jpeg), dtype=torch.uint8), mode=tvio.ImageReadMode.RGB)
        return augment(pixels)

    return decode


class Shards(IterableDataset):
    def __init__(self, files, decoder):
        self.files = files
        self.decoder = decoder

    def __iter__(self):
        info = get_worker_info()
        mine = self.files if info is None else self.files[info.id :: info.num_workers]
        transform = pil_transform() if self.decoder == "pil" else tv_transform()
        for path in mine:
            for record in tfrecord_iterator(path):
                jpeg, label = example(record)
                yield transform(jpeg), label


def run(directory, decoder, workers, epochs):
    torch.set_num_threads(1)
    files = sorted(glob.glob(os.path.join(directory, "shard-*.tfrecord")))
    for epoch in range(epochs):
        loader = DataLoader(Shards(files, decoder), batch_size=64, num_workers=workers)
        start = time.perf_counter()
        images = 0
        for batch, _ in loader:
            images += int(batch.shape[0])
        seconds = time.perf_counter() - start
        print(
            f"epoch {epoch}: {images} images in {seconds:.2f} s: {images / seconds:.0f} images/s "
            f"(PyTorch DataLoader, {decoder}, {workers} workers)"
        )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--decoder", choices=["pil", "tv"], default="pil")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    run(args.directory, args.decoder, args.workers, args.epochs)


if __name__ == "__main__":
    main()
