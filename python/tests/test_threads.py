"""Threads, the GIL, Ctrl-C and fork."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import tfpipe
from conftest import SCHEMA


@pytest.fixture
def endless(tmp_path):
    """A dataset whose `next()` never returns on its own: an empty file,
    repeated (almost) forever, so the engine loops through empty passes.
    `close()` (or a stop after Ctrl-C) ends it at the next pass."""
    path = tmp_path / "empty.tfrecord"
    with tfpipe.TFRecordWriter(path):
        pass
    return tfpipe.Dataset.tfrecord(path).repeat(10**15)


GIL_CHECK = r"""
import sys, threading, time, tfpipe
ds = tfpipe.Dataset.tfrecord(sys.argv[1]).repeat(10**15)
it = iter(ds)
blocked = threading.Thread(target=lambda: next(it, None))
blocked.start()
time.sleep(0.1)  # the thread is inside next()
ticks, end = 0, time.monotonic() + 0.3
while time.monotonic() < end:
    ticks += 1
it.close()  # the waiting next() returns
blocked.join()
print(ticks)
"""


def test_next_releases_the_gil_while_it_waits(endless, tmp_path):
    # In a child process: were the GIL held through next(), this thread could
    # never run again and the check would hang rather than fail.
    path = endless._ops[0]["paths"][0]
    out = subprocess.run([sys.executable, "-c", GIL_CHECK, path], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # Python ran freely for 0.3 s while another thread waited in next().
    assert int(out.stdout) > 10_000, out.stdout


@pytest.fixture
def ctrl_c_raises():
    """Python's own Ctrl-C handler, as an interactive Python has it: a
    process started with SIGINT ignored (a background job of a
    non-interactive shell, as CI may start the suite) inherits the
    disposition, and Python then never raises KeyboardInterrupt."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_interrupts_a_blocked_next_within_100_ms(endless, ctrl_c_raises):
    it = iter(endless.prefetch(2))
    assert tfpipe._tfpipe.live_threads() > 0
    sent = []

    def interrupt():
        time.sleep(0.3)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    # If Ctrl-C did not work, this ends the wait so the test fails, not hangs.
    guard = threading.Timer(10, it.close)
    guard.start()
    t = threading.Thread(target=interrupt)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(it)
        latency = time.monotonic() - sent[0]
    finally:
        guard.cancel()
        t.join()
    assert latency < 0.1, f"KeyboardInterrupt {latency * 1e3:.0f} ms after SIGINT"
    with pytest.raises(RuntimeError, match="interrupted"):
        next(it)
    # The pipeline was stopped: its threads end and are joined.
    it.close()
    assert tfpipe._tfpipe.live_threads() == 0


def test_dropping_an_iterator_mid_epoch_joins_its_threads(small):
    ds = tfpipe.Dataset.tfrecord(small).interleave(4, 2, num_parallel_calls=2).repeat().batch(4).parse(SCHEMA, 2).prefetch(2)
    it = iter(ds)
    for _ in range(5):
        next(it)
    # The parse's two workers at least (the readers may be between files; a
    # prefetch right after the parse adds no thread).
    assert tfpipe._tfpipe.live_threads() >= 2
    del it
    gc.collect()
    assert tfpipe._tfpipe.live_threads() == 0


def test_one_iterator_two_threads_is_an_error_not_a_deadlock(endless):
    it = iter(endless)
    results = []
    t = threading.Thread(target=lambda: results.append(_next_or_error(it)))
    t.start()
    time.sleep(0.2)  # the thread is waiting in next()
    with pytest.raises(RuntimeError, match="another thread"):
        next(it)
    it.close()  # ends the other thread's wait: its stream is over
    t.join(5)
    assert len(results) == 1 and isinstance(results[0], StopIteration)
    assert next(it, "end") == "end"


def _next_or_error(it):
    try:
        return next(it)
    except Exception as e:  # noqa: BLE001 - reported to the test
        return e


def _wait_child(pid, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_fork_child_iterates_when_the_parent_runs_no_pipeline(small):
    ds = tfpipe.Dataset.tfrecord(small).interleave(2, 4, num_parallel_calls=2).batch(10).parse(SCHEMA).prefetch(2)
    assert len(list(ds)) == 10  # the parent ran one, and it is over
    pid = os.fork()
    if pid == 0:
        ok = sum(len(b["id"]) for b in ds) == 100
        os._exit(0 if ok else 1)
    assert _wait_child(pid) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_fork_with_a_running_pipeline_fails_clearly_in_the_child(small):
    ds = tfpipe.Dataset.tfrecord(small).batch(10).prefetch(2)
    it = iter(ds)
    next(it)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            next(it)
            code = 2
        except RuntimeError as e:
            code = 0 if "another process" in str(e) else 3
        try:
            iter(ds)
            code = code or 4
        except RuntimeError as e:
            code = code or (0 if "forked while" in str(e) else 5)
        os._exit(code)
    assert _wait_child(pid) == 0
    assert len(next(it)) == 10  # the parent's iterator is untouched
    it.close()
