"""The framework adapters: torch, Grain, Keras (each skipped without its framework)."""

from __future__ import annotations

import numpy as np
import pytest

import tfpipe
from conftest import SCHEMA, write_dataset


def test_the_package_imports_without_any_framework():
    import subprocess
    import sys

    code = (
        "import sys, tfpipe\n"
        "bad = [m for m in ('torch', 'grain', 'keras', 'jax', 'tensorflow') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_worker_shares_are_disjoint_and_cover_everything(tmp_path):
    paths = write_dataset(tmp_path, 6, 5)
    ds = tfpipe.Dataset.tfrecord(paths).batch(100).parse(SCHEMA)
    shares = [[int(i) for b in tfpipe._worker_share(ds, k, 3) for i in b["id"]] for k in range(3)]
    assert sorted(i for s in shares for i in s) == list(range(30))
    # Inside rank 1 of 2: the workers split that rank's share.
    ranked = tfpipe.Dataset.tfrecord(paths).rank(1, 2).batch(100).parse(SCHEMA)
    rank_ids = sorted(int(i) for b in ranked for i in b["id"])
    parts = [[int(i) for b in tfpipe._worker_share(ranked, k, 3) for i in b["id"]] for k in range(3)]
    assert sorted(i for p in parts for i in p) == rank_ids


def test_torch_iterable_dataset(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    import tfpipe.torch

    paths = write_dataset(tmp_path, 4, 10)
    ds = tfpipe.Dataset.tfrecord(paths).batch(8).parse(SCHEMA)
    batches = list(DataLoader(tfpipe.torch.IterableDataset(ds), batch_size=None))
    assert isinstance(batches[0]["x"], torch.Tensor) and batches[0]["x"].shape == (8, 3)
    assert sorted(int(i) for b in batches for i in b["id"]) == list(range(40))
    two = list(DataLoader(tfpipe.torch.IterableDataset(ds), batch_size=None, num_workers=2))
    assert sorted(int(i) for b in two for i in b["id"]) == list(range(40))


def test_torch_stateful_dataloader(tmp_path):
    pytest.importorskip("torch")
    sdl = pytest.importorskip("torchdata.stateful_dataloader")

    import tfpipe.torch

    paths = write_dataset(tmp_path, 4, 10)
    ds = tfpipe.Dataset.tfrecord(paths).shuffle(16, seed=1).batch(4).parse(SCHEMA)
    full = [b["id"].tolist() for b in sdl.StatefulDataLoader(tfpipe.torch.IterableDataset(ds), batch_size=None)]
    loader = sdl.StatefulDataLoader(tfpipe.torch.IterableDataset(ds), batch_size=None)
    it = iter(loader)
    head = [next(it)["id"].tolist() for _ in range(3)]
    state = loader.state_dict()
    again = sdl.StatefulDataLoader(tfpipe.torch.IterableDataset(ds), batch_size=None)
    again.load_state_dict(state)
    assert head + [b["id"].tolist() for b in again] == full


def test_grain_iter_dataset_with_state(tmp_path):
    grain = pytest.importorskip("grain")

    import tfpipe.grain

    paths = write_dataset(tmp_path, 3, 10)
    ds = tfpipe.Dataset.tfrecord(paths).shuffle(8, seed=2).batch(4).parse(SCHEMA)
    source = tfpipe.grain.IterDataset(ds)
    assert isinstance(source, grain.IterDataset)
    doubled = source.map(lambda b: b["id"] * 2)
    full = [b.tolist() for b in doubled]
    assert sorted(i // 2 for b in full for i in b) == list(range(30))
    it = iter(doubled)
    head = [next(it).tolist() for _ in range(3)]
    state = it.get_state()
    it2 = iter(doubled)
    it2.set_state(state)
    assert head + [b.tolist() for b in it2] == full


# Keras does not know a Grain dataset's length: the first epoch ends by
# running out, which it reports with this warning for every such dataset.
@pytest.mark.filterwarnings("ignore:Your input ran out of data:UserWarning")
def test_keras_fit_on_the_adapter(tmp_path):
    pytest.importorskip("grain")
    keras = pytest.importorskip("keras")

    import tfpipe.keras

    rng = np.random.default_rng(0)
    path = tmp_path / "train.tfrecord"
    with tfpipe.TFRecordWriter(path) as w:
        for _ in range(256):
            x = rng.normal(size=4).astype(np.float32)
            w.write(tfpipe.encode_example({"x": x, "y": int(x.sum() > 0)}))
    ds = tfpipe.Dataset.tfrecord(path).shuffle(256, seed=0).batch(32).parse(["x:float32:4", "y:int64"])
    train = tfpipe.keras.dataset(ds, x="x", y="y")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    # shuffle=False: the tfpipe dataset shuffles (Keras warns that it cannot).
    history = model.fit(train, epochs=4, validation_data=train, shuffle=False, verbose=0)
    assert len(history.history["loss"]) == 4
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert history.history["val_accuracy"][-1] > 0.8
