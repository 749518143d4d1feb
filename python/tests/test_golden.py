"""Values against TensorFlow's own reading of testdata/tf-golden."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

import tfpipe
from conftest import GOLDEN, decode_value, same_floats

EXAMPLE_SCHEMA = [
    "id:int64",
    "label:bytes=<none>",
    "score:float32=-1",
    "emb:float32:3=0",
    "flag:int64=-1",
    "tags:bytes:var",
    "counts:int64:var",
    "weights:float32:var",
]


@pytest.mark.parametrize("name", ["examples.tfrecord", "examples.tfrecord.gz", "examples.tfrecord.zlib", "sequence.tfrecord"])
def test_records_match_tensorflow(name):
    expected = json.loads((GOLDEN / f"{name}.json").read_text())
    records = list(tfpipe.read_records(GOLDEN / name))
    assert len(records) == expected["num_records"]
    for got, want in zip(records, expected["records"]):
        assert len(got) == want["raw_length"]
        assert hashlib.sha256(got).hexdigest() == want["raw_sha256"]


def _rows_of_sparse(tensor, rows):
    """A VarLenFeature's SparseTensor as one list of values per row."""
    out = [[] for _ in range(rows)]
    for (row, _), v in zip(tensor["indices"], tensor["values"]):
        out[row].append(decode_value(tensor["dtype"], v))
    return out


def _check_batch(got, want):
    rows = len(want["records"])
    for key, tensor in want["features"].items():
        if tensor["sparse"]:
            ragged = got[key]
            assert isinstance(ragged, tfpipe.Ragged), key
            assert len(ragged) == rows
            expected = _rows_of_sparse(tensor, rows)
            for r, values in enumerate(ragged.to_list()):
                if tensor["dtype"] == "float32":
                    assert same_floats(values, expected[r]), (key, r)
                else:
                    assert values == expected[r], (key, r)
            assert ragged.row_splits.dtype == np.int64
        else:
            values = [decode_value(tensor["dtype"], v) for v in tensor["values"]]
            if tensor["dtype"] == "string":
                assert got[key] == values, key
            else:
                array = got[key]
                assert isinstance(array, np.ndarray)
                assert list(array.shape) == tensor["shape"], key
                if tensor["dtype"] == "float32":
                    assert array.dtype == np.float32
                    assert same_floats(array.ravel(), values), key
                else:
                    assert array.dtype == np.int64
                    assert array.ravel().tolist() == values, key


@pytest.mark.parametrize("name", ["examples.tfrecord", "examples.tfrecord.gz", "examples.tfrecord.zlib"])
@pytest.mark.parametrize("order", ["batch_then_parse", "parse_then_batch"])
def test_parse_example_matches_tensorflow(name, order):
    expected = json.loads((GOLDEN / "parse_expected.json").read_text())
    ds = tfpipe.Dataset.tfrecord(GOLDEN / name)
    if order == "batch_then_parse":
        ds = ds.batch(8).parse(EXAMPLE_SCHEMA)
    else:
        ds = ds.parse(EXAMPLE_SCHEMA, num_parallel_calls=2).batch(8)
    batches = list(ds)
    assert len(batches) == expected["num_batches"]
    for got, want in zip(batches, expected["batches"]):
        _check_batch(got, want)


def test_parse_examples_matches_the_pipeline():
    expected = json.loads((GOLDEN / "parse_expected.json").read_text())
    records = list(tfpipe.read_records(GOLDEN / "examples.tfrecord"))
    for want in expected["batches"]:
        rows = want["records"]
        got = tfpipe.parse_examples(records[rows[0] : rows[-1] + 1], tfpipe.Schema(EXAMPLE_SCHEMA))
        _check_batch(got, want)


def test_sequence_examples_match_tensorflow():
    """SequenceExamples one record at a time (no batch: no batch dimension)."""
    expected = json.loads((GOLDEN / "parse_sequence_expected.json").read_text())
    schema = tfpipe.Schema(
        [
            "seq_id:int64",
            "lang:bytes=und",
            "ctx_score:float32:var",
            "frames:float32:seq:2",
            "tokens:int64:seq:var",
            "words:bytes:seq:var",
        ]
    )
    got = list(tfpipe.Dataset.tfrecord(GOLDEN / "sequence.tfrecord").parse(schema))
    assert len(got) == len(expected["records"])
    for record, want in zip(got, expected["records"]):
        ctx, seq = want["context"], want["sequence"]
        assert record["seq_id"].shape == ()
        assert int(record["seq_id"]) == decode_value("int64", ctx["seq_id"]["values"][0])
        assert record["lang"] == decode_value("string", ctx["lang"]["values"][0])
        assert same_floats(record["ctx_score"], [decode_value("float32", v) for v in ctx["ctx_score"]["values"]])
        frames = seq["frames"]
        assert list(record["frames"].shape) == frames["shape"]
        assert same_floats(record["frames"].ravel(), [decode_value("float32", v) for v in frames["values"]])
        for key in ("tokens", "words"):
            tensor = seq[key]
            steps = tensor["dense_shape"][0] if tensor["dense_shape"] else 0
            ragged = record[key]
            assert isinstance(ragged, tfpipe.Ragged)
            # TensorFlow's dense_shape counts the steps; trailing empty steps have no index.
            assert len(ragged) >= steps
            want_rows = _rows_of_sparse(tensor, len(ragged))
            assert ragged.to_list() == want_rows, key


@pytest.mark.parametrize(
    "name, record, offset",
    [("data_crc_mismatch", 10, 2220), ("length_crc_mismatch", 20, 4348), ("truncated", 49, 9549)],
)
def test_corrupt_files_raise_data_error_with_location(name, record, offset):
    path = GOLDEN / "corrupt" / f"{name}.tfrecord"
    it = iter(tfpipe.Dataset.tfrecord(path))
    good = 0
    with pytest.raises(tfpipe.DataError) as info:
        for _ in it:
            good += 1
    assert good == record
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.path, err.record, err.offset) == (str(path), record, offset)
    assert str(path) in str(err) and str(record) in str(err)


def test_corrupt_record_found_by_parse_stage_keeps_its_location():
    """The error surfaces through batch, parse and prefetch with the same location."""
    path = GOLDEN / "corrupt" / "data_crc_mismatch.tfrecord"
    ds = tfpipe.Dataset.tfrecord(path).batch(4).parse(EXAMPLE_SCHEMA).prefetch(2)
    with pytest.raises(tfpipe.DataError) as info:
        list(ds)
    assert (info.value.record, info.value.offset) == (10, 2220)


def test_ignore_errors_stops_at_the_corruption_like_tensorflow():
    path = GOLDEN / "corrupt" / "truncated.tfrecord"
    assert len(list(tfpipe.Dataset.tfrecord(path).ignore_errors())) == 49
