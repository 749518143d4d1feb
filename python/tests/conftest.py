"""Shared fixtures: the golden files, small generated datasets, an S3 server."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tfpipe

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "testdata" / "tf-golden"


def decode_value(dtype: str, v):
    """One value in the golden JSON encoding (testdata/tf-golden/README.md)."""
    if dtype in ("string", "bytes_list"):
        return base64.b64decode(v)
    if dtype in ("int64", "int64_list"):
        return int(v)
    special = {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf, "-0.0": -0.0}
    return np.float32(special.get(v, v) if isinstance(v, str) else v)


def same_floats(a, b) -> bool:
    """Equal as float32 bit patterns up to NaN payloads (-0.0 != 0.0)."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    if a.shape != b.shape:
        return False
    both_nan = np.isnan(a) & np.isnan(b)
    return bool(np.all(both_nan | (a.view(np.uint32) == b.view(np.uint32))))


def write_dataset(directory: Path, files: int, per_file: int, compression=None) -> list:
    """`files` TFRecord files of `per_file` Examples: id (global), x (3 floats), tags (bytes, var)."""
    paths = []
    n = 0
    suffix = {None: "", "GZIP": ".gz", "ZLIB": ".zlib"}[compression]
    for f in range(files):
        path = directory / f"part-{f:02d}.tfrecord{suffix}"
        with tfpipe.TFRecordWriter(path, compression) as w:
            for _ in range(per_file):
                w.write(
                    tfpipe.encode_example(
                        {"id": n, "x": np.array([n, n + 0.5, -n], dtype=np.float32), "tags": [b"t"] * (n % 3)}
                    )
                )
                n += 1
        paths.append(str(path))
    return paths


SCHEMA = ["id:int64", "x:float32:3", "tags:bytes:var"]


@pytest.fixture
def small(tmp_path):
    """4 files of 25 records (ids 0..99)."""
    return write_dataset(tmp_path, 4, 25)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 (a free port), stopped after the session."""
    pytest.importorskip("moto")
    boto3 = pytest.importorskip("boto3")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start")
                time.sleep(0.1)
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        yield endpoint, client
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(autouse=True)
def _no_thread_leaks():
    """Every test leaves no tfpipe thread running (iterators are joined when dropped)."""
    yield
    import gc

    gc.collect()
    deadline = time.monotonic() + 5
    while tfpipe._tfpipe.live_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
        gc.collect()
    assert tfpipe._tfpipe.live_threads() == 0, "a tfpipe thread outlived its test"


def pytest_configure(config):
    os.environ.setdefault("KERAS_BACKEND", "jax")
