"""Combining datasets: sample_from, choose_from and concatenate, as the Rust
engine runs them (tests/pipeline/combine.rs checks them against tf.data)."""

from __future__ import annotations

import json
import pathlib
import pickle
import random

import pytest

import tfpipe
from conftest import SCHEMA


def _ids(ds):
    return [int(i) for b in ds for i in b["id"]]


def test_concatenate_reads_one_then_the_other(small):
    a = tfpipe.Dataset.tfrecord(small[:2])
    b = tfpipe.Dataset.tfrecord(small[2:])
    ds = a.concatenate(b).batch(30).parse(SCHEMA)
    assert _ids(ds) == list(range(100))
    assert [len(x["id"]) for x in ds] == [30, 30, 30, 10], "batches cross the join, as in tf.data"


def test_sample_from_is_seeded_weighted_and_covers_every_record(small):
    a = tfpipe.Dataset.tfrecord(small[:1])  # ids 0..24
    b = tfpipe.Dataset.tfrecord(small[1:])  # ids 25..99
    mix = tfpipe.Dataset.sample_from([a, b], [0.5, 0.5], seed=11).batch(10).parse(SCHEMA)
    first = _ids(mix)
    assert sorted(first) == list(range(100)), "renormalised: every record once"
    assert first == _ids(mix), "the same seed draws the same sequence"
    other = tfpipe.Dataset.sample_from([a, b], [0.5, 0.5], seed=12).batch(10).parse(SCHEMA)
    assert _ids(other) != first
    # Each input keeps its order.
    assert [i for i in first if i < 25] == list(range(25))
    stopped = _ids(tfpipe.Dataset.sample_from([a, b], [0.5, 0.5], seed=11, stop_on_empty_dataset=True).batch(10).parse(SCHEMA))
    assert len(stopped) < 100 and stopped == first[: len(stopped)]


def test_sample_from_proportions_within_five_sigma(tmp_path):
    """Each draw picks input 0 with probability 1/4: over n draws the count is
    binomial, and more than 5 standard deviations off has probability < 6e-7."""
    sources = []
    for marker in (0, 1):
        path = tmp_path / f"only-{marker}.tfrecord"
        with tfpipe.TFRecordWriter(path) as w:
            for _ in range(1000):
                w.write(tfpipe.encode_example({"id": marker}))
        sources.append(tfpipe.Dataset.tfrecord(str(path)).repeat())
    n, p = 20_000, 0.25
    mix = tfpipe.Dataset.sample_from(sources, [1, 3], seed=5).take(n).batch(1000).parse(["id:int64"])
    ids = _ids(mix)
    assert len(ids) == n
    mean, sigma = n * p, (n * p * (1 - p)) ** 0.5
    assert abs(ids.count(0) - mean) <= 5 * sigma, (ids.count(0), mean, sigma)


def test_choose_from_follows_the_choices(small):
    a = tfpipe.Dataset.tfrecord(small[:1])
    b = tfpipe.Dataset.tfrecord(small[1:2])
    ds = tfpipe.Dataset.choose_from([a, b], [1, 0, 0, 1]).batch(10).parse(SCHEMA)
    assert _ids(ds) == [25, 0, 1, 26]


def test_a_mixture_resumes_exactly_from_its_state(small):
    inputs = [
        tfpipe.Dataset.tfrecord(small[:2]).interleave(2, 3, num_parallel_calls=2).shuffle(10, seed=1),
        tfpipe.Dataset.tfrecord(small[2:]).shuffle(7, seed=2).prefetch(3),
    ]
    ds = tfpipe.Dataset.sample_from(inputs, [2, 1], seed=4).repeat(2).batch(6).parse(SCHEMA, num_parallel_calls=2)
    full = [b["id"].tolist() for b in ds]
    assert sorted(i for b in full for i in b) == sorted(list(range(100)) * 2)
    rng = random.Random(3)
    for cut in sorted(rng.sample(range(len(full) + 1), 4)):
        it = iter(ds)
        head = [next(it)["id"].tolist() for _ in range(cut)]
        state = json.loads(json.dumps(it.get_state()))
        del it
        assert head + [b["id"].tolist() for b in ds.iter(state=state)] == full, cut


def test_errors_name_the_input_and_metrics_list_each_input(tmp_path, small):
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(pathlib.Path(small[0]).read_bytes()[:50])
    mix = tfpipe.Dataset.sample_from([tfpipe.Dataset.tfrecord(small[1:]), tfpipe.Dataset.tfrecord([str(bad)])], seed=1)
    with pytest.raises(tfpipe.DataError) as err:
        for _ in mix:
            pass
    assert "sample_from[1]" in str(err.value) and err.value.path == str(bad)
    it = iter(tfpipe.Dataset.sample_from([tfpipe.Dataset.tfrecord(small[:2]), tfpipe.Dataset.tfrecord(small[2:])], seed=1))
    for _ in it:
        pass
    names = [s["name"] for s in it.metrics()["stages"]]
    for name in ("sample_from[0]/tfrecord", "sample_from[0]", "sample_from[1]/tfrecord", "sample_from[1]", "sample_from"):
        assert name in names, names


def test_combined_datasets_pickle_and_check_their_arguments(small):
    a = tfpipe.Dataset.tfrecord(small)
    ds = tfpipe.Dataset.sample_from([a, a.skip(3)], [1, 2], seed=3).concatenate(a)
    assert pickle.loads(pickle.dumps(ds)) == ds
    assert "sample_from" in repr(ds)
    with pytest.raises(ValueError):
        tfpipe.Dataset.sample_from([a, a], [1])
    with pytest.raises(ValueError):
        tfpipe.Dataset.sample_from([a], [-1])
    with pytest.raises(ValueError):
        tfpipe.Dataset.sample_from([])
    with pytest.raises(TypeError):
        a.concatenate([a])
    with pytest.raises(ValueError, match="same kind of element"):
        iter(a.concatenate(a.batch(2)))


def test_worker_shares_of_a_mixture_are_disjoint_and_cover_it(small):
    """A DataLoader's workers each read a share of every input of a mixture."""
    a = tfpipe.Dataset.tfrecord(small[:2])
    b = tfpipe.Dataset.tfrecord(small[2:])
    ds = tfpipe.Dataset.sample_from([a, b], seed=1).concatenate(a).batch(100).parse(SCHEMA)
    shares = [_ids(tfpipe._worker_share(ds, k, 2)) for k in range(2)]
    assert sorted(shares[0] + shares[1]) == sorted(list(range(100)) + list(range(50)))
    assert len(shares[0]) == len(shares[1]) == 75


def test_zip_yields_tuples_of_each_datasets_elements(small):
    ids = tfpipe.Dataset.tfrecord(small[:2]).batch(10).parse(SCHEMA)  # ids 0..49
    raw = tfpipe.Dataset.tfrecord(small[2:])  # 50 records
    rows = tfpipe.Dataset.tfrecord(small[1:]).parse(SCHEMA)  # ids 25.., one at a time
    out = list(tfpipe.Dataset.zip(ids, raw, rows))
    assert len(out) == 5, "ends with the shortest dataset"
    first = out[0]
    assert isinstance(first, tuple) and len(first) == 3
    assert first[0]["id"].tolist() == list(range(10))
    assert first[1] == pathlib.Path(small[2]).read_bytes()[12 : 12 + len(first[1])], "the first record's bytes"
    assert int(first[2]["id"]) == 25 and first[2]["x"].shape == (3,)
    assert [int(t[2]["id"]) for t in out] == [25, 26, 27, 28, 29]
    # Dataset.zip((a, b)) is Dataset.zip(a, b); nested zips nest tuples.
    assert tfpipe.Dataset.zip((ids, raw)) == tfpipe.Dataset.zip(ids, raw)
    nested = next(iter(tfpipe.Dataset.zip(tfpipe.Dataset.zip(ids, rows), raw)))
    assert isinstance(nested[0], tuple) and int(nested[0][1]["id"]) == 25


def test_zip_resumes_exactly_and_composes_with_element_operations(small):
    a = tfpipe.Dataset.tfrecord(small[:2]).interleave(2, 3, num_parallel_calls=2).batch(4).parse(SCHEMA)
    b = tfpipe.Dataset.tfrecord(small[2:]).shuffle(9, seed=3).batch(4).parse(SCHEMA).prefetch(2)
    ds = tfpipe.Dataset.zip(a, b).repeat(2).skip(1)

    def key(t):
        return (t[0]["id"].tolist(), t[1]["id"].tolist())

    full = [key(t) for t in ds]
    assert len(full) == 2 * 13 - 1
    once = [key(t) for t in tfpipe.Dataset.zip(a, b)]
    assert once[1:] == full[:12]
    shuffled = [key(t) for t in tfpipe.Dataset.zip(a, b).shuffle(5, seed=1)]
    assert shuffled != once and sorted(shuffled) == sorted(once), "a shuffle of the tuples"
    for cut in (0, 1, 7, 12, 13, 20, len(full)):
        it = iter(ds)
        head = [key(next(it)) for _ in range(cut)]
        state = json.loads(json.dumps(it.get_state()))
        del it
        assert head + [key(t) for t in ds.iter(state=state)] == full, cut


def test_zip_errors_name_the_input_and_misuse_is_refused(tmp_path, small):
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(pathlib.Path(small[0]).read_bytes()[:50])
    ds = tfpipe.Dataset.zip(tfpipe.Dataset.tfrecord(small), tfpipe.Dataset.tfrecord([str(bad)]))
    with pytest.raises(tfpipe.DataError) as err:
        list(ds)
    assert "zip[1]" in str(err.value) and err.value.path == str(bad)
    pair = tfpipe.Dataset.zip(tfpipe.Dataset.tfrecord(small), tfpipe.Dataset.tfrecord(small))
    for misuse in (pair.parse(SCHEMA), pair.window(2), pair.unbatch()):
        with pytest.raises(ValueError, match="tuples"):
            iter(misuse)
    with pytest.raises(ValueError):
        tfpipe.Dataset.zip()
    with pytest.raises(TypeError):
        tfpipe.Dataset.zip(pair, [1])
    assert pickle.loads(pickle.dumps(pair)) == pair
    # Tuples concatenate and mix with tuples, not with other elements.
    assert len(list(pair.concatenate(pair))) == 200
    with pytest.raises(ValueError, match="same kind of element"):
        iter(pair.concatenate(tfpipe.Dataset.tfrecord(small)))


def test_worker_shares_of_a_zip_keep_the_pairs(small):
    a = tfpipe.Dataset.tfrecord(small).batch(10).parse(SCHEMA)
    b = tfpipe.Dataset.tfrecord(small).batch(10).parse(SCHEMA).skip(1)
    ds = tfpipe.Dataset.zip(a, b)
    shares = [[(t[0]["id"][0], t[1]["id"][0]) for t in tfpipe._worker_share(ds, k, 2)] for k in range(2)]
    assert sorted(shares[0] + shares[1]) == [(10 * i, 10 * i + 10) for i in range(9)]
    assert len(shares[0]) == 5 and len(shares[1]) == 4


def test_a_batch_of_zipped_tuples_is_a_tuple_of_batches(small):
    """tf.data's ``zip((features, labels)).batch(n)``: each part batched."""
    rows = tfpipe.Dataset.tfrecord(small).parse(SCHEMA)  # single rows, ids 0..99
    raw = tfpipe.Dataset.tfrecord(small[1:])  # records, 75
    nested = tfpipe.Dataset.zip(rows.skip(1), rows)
    ds = tfpipe.Dataset.zip(rows, raw, nested).batch(8, drop_remainder=True)
    out = list(ds)
    assert len(out) == 9, "75 tuples, 9 full batches of 8"
    ids, records, (ahead, same) = out[0]
    assert ids["id"].tolist() == list(range(8)) and ids["x"].shape == (8, 3)
    assert ids["tags"].to_list()[:3] == [[], [b"t"], [b"t", b"t"]], "var-length rows stay ragged"
    assert isinstance(records, list) and len(records) == 8 and records[0] == list(tfpipe.read_records(small[1]))[0]
    assert ahead["id"].tolist() == list(range(1, 9)) and same["id"].tolist() == list(range(8))
    # A part that is a batch already cannot be batched again.
    with pytest.raises(Exception, match="a batch already"):
        list(tfpipe.Dataset.zip(rows, raw.batch(2)).batch(4))
