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
