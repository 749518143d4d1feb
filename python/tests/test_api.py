"""The Python API: datasets, state, ranks, pickling, errors, I/O helpers."""

from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pytest

import tfpipe
from conftest import SCHEMA, write_dataset


def _ids(batches):
    return [int(i) for b in batches for i in b["id"]]


def test_batches_are_dicts_of_arrays(small):
    batches = list(tfpipe.Dataset.tfrecord(small).batch(32).parse(SCHEMA))
    assert [len(b["id"]) for b in batches] == [32, 32, 32, 4]
    assert set(batches[0]) == {"id", "x", "tags"}
    assert _ids(batches) == list(range(100))


def test_batch_sizes_and_drop_remainder(small):
    ds = tfpipe.Dataset.tfrecord(small).interleave(4, 16).batch(32)
    assert [len(b) for b in ds] == [32, 32, 32, 4]
    assert [len(b) for b in tfpipe.Dataset.tfrecord(small).batch(32, drop_remainder=True)] == [32, 32, 32]


def test_arrays_own_their_memory_moved_out_of_rust(small):
    batch = next(iter(tfpipe.Dataset.tfrecord(small).batch(8).parse(SCHEMA)))
    x = batch["x"]
    assert x.shape == (8, 3) and x.dtype == np.float32
    # The base is the Rust owner (rust-numpy's container of the moved Vec),
    # not another array: no view of an engine buffer, no copy.
    assert not isinstance(x.base, np.ndarray)
    assert type(x.base).__name__ == "PySliceContainer"
    assert not x.flags.owndata and x.flags.c_contiguous and x.flags.writeable
    tags = batch["tags"]
    assert isinstance(tags, tfpipe.Ragged)
    assert tags.to_list() == [[b"t"] * (i % 3) for i in range(8)]
    assert tags.row_splits.tolist() == [0, 0, 1, 3, 3, 4, 6, 6, 7]


def test_unbatched_parse_has_no_batch_dimension(small):
    first = next(iter(tfpipe.Dataset.tfrecord(small).parse(SCHEMA)))
    assert first["id"].shape == () and int(first["id"]) == 0
    assert first["x"].shape == (3,)
    assert first["tags"] == []


def test_records_and_record_batches(small):
    records = list(tfpipe.Dataset.tfrecord(small[0]))
    assert len(records) == 25 and all(isinstance(r, bytes) for r in records)
    batches = list(tfpipe.Dataset.tfrecord(small[0]).batch(10))
    assert [len(b) for b in batches] == [10, 10, 5] and batches[0][0] == records[0]


def test_take_skip_repeat_shard(small):
    ds = tfpipe.Dataset.tfrecord(small).parse(SCHEMA).batch(10)
    assert _ids(ds.skip(2).take(3)) == list(range(20, 50))
    assert _ids(tfpipe.Dataset.tfrecord(small).repeat(2).batch(50).parse(SCHEMA)) == list(range(100)) * 2
    shards = [_ids(tfpipe.Dataset.tfrecord(small).shard(2, i).batch(100).parse(SCHEMA)) for i in range(2)]
    assert shards == [list(range(0, 25)) + list(range(50, 75)), list(range(25, 50)) + list(range(75, 100))]


def test_shuffle_is_a_seeded_permutation(small):
    ds = tfpipe.Dataset.tfrecord(small).interleave(2, 4).shuffle(30, seed=7).batch(16).parse(SCHEMA)
    a, b = _ids(ds), _ids(ds)
    assert a == b and sorted(a) == list(range(100)) and a != list(range(100))


STATE_PIPELINE_EPOCHS = 2


def _state_dataset(paths):
    return (
        tfpipe.Dataset.tfrecord(paths)
        .interleave(3, 5, num_parallel_calls=2)
        .shuffle(20, seed=3)
        .repeat(STATE_PIPELINE_EPOCHS)
        .batch(7)
        .parse(SCHEMA, num_parallel_calls=2)
        .prefetch(2)
    )


def test_state_at_random_cut_points_continues_exactly(small):
    ds = _state_dataset(small)
    full = [b["id"].tolist() for b in ds]
    assert sum(len(b) for b in full) == 100 * STATE_PIPELINE_EPOCHS
    rng = random.Random(5)
    for cut in sorted(rng.sample(range(len(full) + 1), 5)) + [0, len(full)]:
        it = iter(ds)
        head = [next(it)["id"].tolist() for _ in range(cut)]
        state = json.loads(json.dumps(it.get_state()))  # JSON-serialisable
        del it
        rest = [b["id"].tolist() for b in ds.iter(state=state)]
        assert head + rest == full, cut
        it = iter(ds)
        it.set_state(state)
        assert [b["id"].tolist() for b in it] == full[cut:]


def test_state_of_an_exhausted_iterator_resumes_to_nothing(small):
    ds = tfpipe.Dataset.tfrecord(small).batch(30)
    it = iter(ds)
    assert len(list(it)) == 4
    state = it.get_state()
    assert list(ds.iter(state=state)) == []


def test_set_state_after_next_is_refused(small):
    ds = tfpipe.Dataset.tfrecord(small).batch(10)
    it = iter(ds)
    state = it.get_state()
    next(it)
    with pytest.raises(RuntimeError, match="before the first next"):
        it.set_state(state)


def test_state_of_another_dataset_is_refused(small):
    it = iter(tfpipe.Dataset.tfrecord(small).shuffle(10, seed=1).batch(10))
    next(it)
    state = it.get_state()
    with pytest.raises(ValueError):
        list(tfpipe.Dataset.tfrecord(small).batch(10).iter(state=state))


def test_ranks_are_disjoint_and_equal(tmp_path):
    # 5 files of 20 for 2 and 7 ranks: the files are cut into runs of
    # records, so fewer than one record per rank is dropped (by file, 2
    # ranks dropped a whole file).
    paths = write_dataset(tmp_path, 5, 20)
    for world in (2, 7):
        shares = [_ids(tfpipe.Dataset.tfrecord(paths).rank(r, world).batch(64).parse(SCHEMA)) for r in range(world)]
        sizes = {len(s) for s in shares}
        assert len(sizes) == 1, (world, [len(s) for s in shares])
        seen = [i for s in shares for i in s]
        assert len(seen) == len(set(seen)), "a record read by two ranks"
        assert len(seen) == 100 - 100 % world


def test_rank_without_arguments_reads_the_launcher(monkeypatch, small):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    ds = tfpipe.Dataset.tfrecord(small).rank()
    assert ds == tfpipe.Dataset.tfrecord(small).rank(1, 2)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("LOCAL_RANK")
    assert len(list(tfpipe.Dataset.tfrecord(small).rank())) == 100


def test_pickle_round_trip(small):
    ds = tfpipe.Dataset.tfrecord(small).shuffle(10).batch(10).parse(tfpipe.Schema(SCHEMA, label="id")).prefetch(1)
    again = pickle.loads(pickle.dumps(ds))
    assert again == ds
    assert _ids(again) == _ids(ds)
    schema = pickle.loads(pickle.dumps(tfpipe.Schema(SCHEMA, label="id")))
    assert schema == tfpipe.Schema(SCHEMA, label="id") and schema.label == "id"
    batch = next(iter(ds))
    assert pickle.loads(pickle.dumps(batch["tags"])) == batch["tags"]
    with pytest.raises(TypeError):
        pickle.dumps(iter(ds))


def test_metrics(small):
    it = iter(tfpipe.Dataset.tfrecord(small).batch(10).parse(SCHEMA).prefetch(2))
    for _ in it:
        pass
    m = it.metrics()
    names = [s["name"] for s in m["stages"]]
    assert "tfrecord" in names and "parse" in names and "prefetch" in names
    assert m["bottleneck"] in names
    assert m["next_wait_s"] >= 0 and m["next_calls"] == 11
    json.dumps(m)


def test_schema_errors_and_missing_files(tmp_path, small):
    with pytest.raises(tfpipe.SchemaError, match="expected NAME:DTYPE"):
        tfpipe.Schema(["image:uint9"])
    assert issubclass(tfpipe.SchemaError, ValueError)
    with pytest.raises(FileNotFoundError):
        tfpipe.Schema.from_file(tmp_path / "none.features.json")
    with pytest.raises(FileNotFoundError, match="no such file"):
        iter(tfpipe.Dataset.tfrecord(tmp_path / "none-*.tfrecord"))
    with pytest.raises(ValueError, match="batch_size=0"):
        tfpipe.Dataset.tfrecord("x").batch(0)
    with pytest.raises(ValueError, match="interleave"):
        iter(tfpipe.Dataset.tfrecord(small).batch(2).interleave(2, 2))


def test_schema_from_file(tmp_path):
    path = tmp_path / "s.features.json"
    path.write_text(json.dumps({"features": ["id:int64", {"name": "x", "dtype": "float32", "shape": [3]}], "label": "id"}))
    schema = tfpipe.Schema.from_file(path)
    assert schema.names == ["id", "x"] and schema.label == "id"
    assert schema.features == ["id:int64", "x:float32:3"]
    path.write_text("{")
    with pytest.raises(tfpipe.SchemaError):
        tfpipe.Schema.from_file(path)


def test_parse_error_is_a_data_error_with_the_record_location(tmp_path):
    path = tmp_path / "bad.tfrecord"
    first = tfpipe.encode_example({"id": 1})
    with tfpipe.TFRecordWriter(path) as w:
        w.write(first)
        w.write(tfpipe.encode_example({"id": [1, 2]}))  # two values for a scalar
    with pytest.raises(tfpipe.DataError, match="feature \"id\"") as info:
        list(tfpipe.Dataset.tfrecord(path).batch(2).parse(["id:int64"]))
    assert (info.value.path, info.value.record, info.value.offset) == (str(path), 1, 16 + len(first))
    with pytest.raises(tfpipe.DataError) as info:
        tfpipe.parse_examples([tfpipe.encode_example({"id": 1}), b"\xff\xff"], ["id:int64"])
    assert (info.value.path, info.value.record, info.value.offset) == (None, 1, None)


def test_writer_is_atomic_and_compresses(tmp_path):
    path = tmp_path / "out.tfrecord.gz"
    with pytest.raises(RuntimeError):
        with tfpipe.TFRecordWriter(path, "auto") as w:
            w.write(b"a")
            raise RuntimeError("stop")
    assert not path.exists(), "a failed write leaves no file under the final name"
    assert list(tmp_path.iterdir()) == []
    with tfpipe.TFRecordWriter(path, "GZIP") as w:
        for i in range(3):
            w.write(b"r%d" % i)
        assert w.records == 3
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    assert list(tfpipe.read_records(path)) == [b"r0", b"r1", b"r2"]
    with pytest.raises(ValueError, match="closed"):
        w.write(b"x")


def test_encode_example_round_trip():
    record = tfpipe.encode_example(
        {
            "i": 7,
            "f": 0.5,
            "b": b"\x00\xff",
            "s": "héllo",
            "ints": [1, 2, 3],
            "floats": np.array([[1.5, 2.5]], dtype=np.float64),
            "img": np.arange(6, dtype=np.uint8).tobytes(),
            "words": ["a", b"b"],
            "flag": True,
        }
    )
    got = tfpipe.parse_examples(
        [record],
        [
            "i:int64",
            "f:float32",
            "b:bytes",
            "s:bytes",
            "ints:int64:var",
            "floats:float32:2",
            "img:uint8:2x3",
            "words:bytes:var",
            "flag:int64",
        ],
    )
    assert got["i"].tolist() == [7] and got["f"].tolist() == [0.5]
    assert got["b"] == [b"\x00\xff"] and got["s"] == ["héllo".encode()]
    assert got["ints"].to_list() == [[1, 2, 3]]
    assert got["floats"].tolist() == [[1.5, 2.5]]
    assert got["img"].dtype == np.uint8 and got["img"].tolist() == [[[0, 1, 2], [3, 4, 5]]]
    assert got["words"].to_list() == [[b"a", b"b"]]
    assert got["flag"].tolist() == [1]
    # An empty list has no type: a Feature with no list, read as no values.
    empty = tfpipe.parse_examples([tfpipe.encode_example({"e": []})], ["e:bytes:var", "d:int64=3"])
    assert empty["e"].to_list() == [[]] and empty["d"].tolist() == [3]
    with pytest.raises(TypeError, match="cannot encode"):
        tfpipe.encode_example({"o": object()})


def test_encode_sequence_example_round_trip(tmp_path):
    schema = [
        "seq_id:int64",
        "lang:bytes=und",
        "frames:float32:seq:2",
        "tokens:int64:seq:var",
        "words:bytes:seq:var",
    ]
    rows = [
        dict(
            context={"seq_id": 7, "lang": "en"},
            feature_lists={
                "frames": np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float32),
                "tokens": [[1, 2], [], [3]],
                "words": [[b"a"], ["b", "c"]],
            },
        ),
        dict(context={"seq_id": 8}, feature_lists={"frames": [[0.5, 1.5]], "tokens": [np.array([9])]}),
        dict(context={"seq_id": 9}),
    ]
    path = tmp_path / "seq.tfrecord"
    with tfpipe.TFRecordWriter(path) as w:
        for row in rows:
            w.write(tfpipe.encode_sequence_example(**row))
    got = list(tfpipe.Dataset.tfrecord(path).parse(tfpipe.Schema(schema)))
    assert [int(r["seq_id"]) for r in got] == [7, 8, 9]
    assert [r["lang"] for r in got] == [b"en", b"und", b"und"]
    assert got[0]["frames"].tolist() == [[1, 2], [3, 4], [5, 6]]
    assert got[1]["frames"].tolist() == [[0.5, 1.5]]
    assert got[2]["frames"].shape == (0, 2)
    assert got[0]["tokens"].to_list() == [[1, 2], [], [3]]
    assert got[1]["tokens"].to_list() == [[9]]
    assert got[0]["words"].to_list() == [[b"a"], [b"b", b"c"]]
    assert got[2]["words"].to_list() == []
    with pytest.raises(TypeError, match='feature list "words": give a list of steps'):
        tfpipe.encode_sequence_example(feature_lists={"words": b"abc"})
    with pytest.raises(TypeError, match='feature list "n": a 0-d array'):
        tfpipe.encode_sequence_example(feature_lists={"n": np.int64(3)})
    with pytest.raises(TypeError, match="cannot encode"):
        tfpipe.encode_sequence_example(context={"o": object()})


def test_sparse_and_ragged_features():
    records = [
        tfpipe.encode_example({"ix": [0, 2], "v": [1.0, 2.0], "vals": [1, 2, 3], "lens": [2, 1]}),
        tfpipe.encode_example({"ix": [1], "v": [3.0], "vals": [4], "lens": [1]}),
    ]
    got = tfpipe.parse_examples(records, ["v:float32:sparse(ix):4", "vals:int64:ragged:row_lengths(lens)"])
    sp = got["v"]
    assert isinstance(sp, tfpipe.Sparse)
    assert sp.indices.tolist() == [[0, 0], [0, 2], [1, 1]]
    assert sp.values.tolist() == [1.0, 2.0, 3.0]
    assert sp.dense_shape.tolist() == [2, 4]
    assert sp.to_dense().tolist() == [[1, 0, 2, 0], [0, 3, 0, 0]]
    r = got["vals"]
    assert isinstance(r, tfpipe.Ragged) and isinstance(r.values, tfpipe.Ragged)
    assert r.to_list() == [[[1, 2], [3]], [[4]]]


def test_index_and_global_shuffle(small):
    written = tfpipe.index(small)
    assert written == [p + ".idx" for p in small]
    ds = tfpipe.Dataset.tfrecord(small).global_shuffle(seed=1).batch(100).parse(SCHEMA)
    ids = _ids(ds)
    assert sorted(ids) == list(range(100)) and ids != list(range(100))
    halves = [_ids(tfpipe.Dataset.tfrecord(small).global_shuffle(1).shard(2, i).batch(100).parse(SCHEMA)) for i in range(2)]
    assert sorted(halves[0] + halves[1]) == list(range(100)) and len(halves[0]) == 50


def test_help_reads_well():
    assert "tf.data" in tfpipe.Dataset.__doc__ or "TFRecord" in tfpipe.Dataset.__doc__
    for name in tfpipe.__all__:
        assert getattr(tfpipe, name).__doc__, name
