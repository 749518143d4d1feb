"""Train a small PyTorch MLP on the bundled MNIST, fed by tfpipe.

    pip install ./python torch
    python python/examples/torch_mnist.py

The engine reads, shuffles, batches and parses on its own threads; the
DataLoader (num_workers=0, the fast path) hands the batches over as tensors
made by torch.from_numpy, without a copy.
"""

from __future__ import annotations

import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader

import tfpipe
import tfpipe.torch
from mnist_data import SCHEMA, write


def main() -> None:
    data = write(tempfile.gettempdir() + "/tfpipe-mnist")
    train = tfpipe.Dataset.tfrecord(data).interleave(4, 16).shuffle(10_000, seed=0).batch(64).parse(SCHEMA).prefetch(2)
    test = tfpipe.Dataset.tfrecord(data.replace("train-*", "test-*")).batch(500).parse(SCHEMA)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(3):
        model.train()
        for batch in DataLoader(tfpipe.torch.IterableDataset(train), batch_size=None):
            x = batch["image_raw"].float() / 255.0
            loss = nn.functional.cross_entropy(model(x), batch["label"])
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for batch in DataLoader(tfpipe.torch.IterableDataset(test), batch_size=None):
                pred = model(batch["image_raw"].float() / 255.0).argmax(1)
                correct += int((pred == batch["label"]).sum())
                total += len(pred)
        print(f"epoch {epoch + 1}: loss {loss.item():.3f}, test accuracy {correct / total:.3f}")


if __name__ == "__main__":
    main()
