"""Object storage: reading from an S3 server on 127.0.0.1 (moto)."""

from __future__ import annotations

import tfpipe
from conftest import SCHEMA, write_dataset


def test_s3_glob_read_parse(s3_server, tmp_path):
    endpoint, client = s3_server
    client.create_bucket(Bucket="tfpipe-test")
    paths = write_dataset(tmp_path, 3, 10)
    for p in paths:
        client.upload_file(p, "tfpipe-test", "train/" + p.rsplit("/", 1)[1])
    tfpipe.set_bucket_options(
        "s3://tfpipe-test",
        {
            "aws_endpoint": endpoint,
            "aws_allow_http": "true",
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            "aws_region": "us-east-1",
        },
    )
    ds = tfpipe.Dataset.tfrecord("s3://tfpipe-test/train/part-*.tfrecord").interleave(2, 4).batch(8).parse(SCHEMA)
    ids = sorted(int(i) for b in ds for i in b["id"])
    assert ids == list(range(30))
    local = [b["id"].tolist() for b in tfpipe.Dataset.tfrecord(paths).interleave(2, 4).batch(8).parse(SCHEMA)]
    assert [b["id"].tolist() for b in ds] == local


def test_s3_missing_object_is_file_not_found(s3_server):
    endpoint, client = s3_server
    client.create_bucket(Bucket="tfpipe-empty")
    tfpipe.set_bucket_options(
        "s3://tfpipe-empty",
        {
            "aws_endpoint": endpoint,
            "aws_allow_http": "true",
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            "aws_region": "us-east-1",
        },
    )
    import pytest

    with pytest.raises(FileNotFoundError):
        list(tfpipe.Dataset.tfrecord("s3://tfpipe-empty/none-*.tfrecord"))


def _bucket(client, endpoint, name):
    client.create_bucket(Bucket=name)
    tfpipe.set_bucket_options(
        f"s3://{name}",
        {
            "aws_endpoint": endpoint,
            "aws_allow_http": "true",
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            "aws_region": "us-east-1",
        },
    )


def _keys(client, bucket):
    return [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_writer_to_s3_appears_only_when_closed(s3_server):
    endpoint, client = s3_server
    _bucket(client, endpoint, "tfpipe-write")
    records = [tfpipe.encode_example({"id": i, "text": f"row {i}"}) for i in range(100)]
    url = "s3://tfpipe-write/out/part-0.tfrecord.gz"
    with tfpipe.TFRecordWriter(url, compression="auto") as w:
        for r in records:
            w.write(r)
        assert w.records == 100
        assert _keys(client, "tfpipe-write") == []  # an uncompleted multipart upload
    assert w.path == url
    assert _keys(client, "tfpipe-write") == ["out/part-0.tfrecord.gz"]
    assert list(tfpipe.read_records(url)) == records


def test_writer_to_s3_leaves_nothing_after_an_error(s3_server):
    endpoint, client = s3_server
    _bucket(client, endpoint, "tfpipe-abort")
    import pytest

    with pytest.raises(RuntimeError, match="stop here"):
        with tfpipe.TFRecordWriter("s3://tfpipe-abort/x.tfrecord") as w:
            w.write(b"one")
            raise RuntimeError("stop here")
    assert _keys(client, "tfpipe-abort") == []
    assert client.list_multipart_uploads(Bucket="tfpipe-abort").get("Uploads", []) == []


def test_writer_to_a_missing_bucket_raises(s3_server):
    endpoint, _client = s3_server
    tfpipe.set_bucket_options(
        "s3://tfpipe-no-such-bucket",
        {
            "aws_endpoint": endpoint,
            "aws_allow_http": "true",
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            "aws_region": "us-east-1",
        },
    )
    import pytest

    with pytest.raises(OSError, match="tfpipe-no-such-bucket"):
        with tfpipe.TFRecordWriter("s3://tfpipe-no-such-bucket/x.tfrecord") as w:
            w.write(b"one")
