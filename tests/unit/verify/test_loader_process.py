"""One Loader child for several batches (betonbuild.loader_process): the write job of a dataset
without partitions runs the smoke gate's batch and the full file's in one child, one ffcv import."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from betonbuild.config.load import load_config
from betonbuild.sources import open_source
from betonbuild.verify import start_loader_process
from betonbuild.write.writer import write_beton


@pytest.fixture
def arrays_spec(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "ffcv.loader", raising=False)  # as in a job's own process
    np.save("x.npy", np.arange(40 * 3, dtype=np.float32).reshape(40, 3))
    np.save("label.npy", np.arange(40, dtype=np.int64))
    entry = {
        "source": {"kind": "arrays", "columns": {"x": "x.npy", "label": "label.npy"}},
        "fields": {"x": {"type": "ndarray", "dtype": "float32", "shape": [3]}, "label": {"type": "int"}},
    }
    return load_config({"datasets": {"d": entry}}).datasets["d"]


def written(spec, path: str, rows: np.ndarray) -> str:
    write_beton(spec, open_source(spec), rows, path, 1, log=open("/dev/null", "w"))
    return path


def test_one_child_reads_two_files_in_turn_and_ends_when_its_stdin_closes(arrays_spec):
    small, whole = written(arrays_spec, "small.beton", np.arange(8)), written(arrays_spec, "d.beton", np.arange(40))
    child = start_loader_process(arrays_spec)
    ok, detail = child.request(small, arrays_spec).result()
    assert ok and "read 8 samples" in detail, detail
    ok, detail = child.request(whole, arrays_spec).result()
    assert ok and "read 16 samples" in detail, detail
    assert child.process.poll() is None  # idle, waiting for a third request
    child.close()
    assert child.process.returncode == 0  # it read EOF and exited by itself, not killed


def test_a_bad_file_fails_its_own_batch_only(arrays_spec, tmp_path: Path):
    (tmp_path / "junk.beton").write_bytes(b"not a beton file")
    good = written(arrays_spec, "d.beton", np.arange(40))
    child = start_loader_process(arrays_spec)
    ok, detail = child.request(str(tmp_path / "junk.beton"), arrays_spec).result()
    assert not ok and "junk.beton" in detail
    assert child.request(good, arrays_spec).result()[0]
    child.close()


def test_kept_open_its_users_close_leaves_it_for_the_next_batch_and_the_exit_ends_it(arrays_spec):
    good = written(arrays_spec, "d.beton", np.arange(40))
    child = start_loader_process(arrays_spec)
    with child.kept_open():
        assert child.request(good, arrays_spec).result()[0]
        child.close()  # what verify_beton and build do with the loader they were given
        assert child.process.poll() is None
        assert child.request(good, arrays_spec).result()[0]
    assert child.process.returncode == 0


def test_a_request_asked_before_the_last_answer_was_read_waits_its_turn(arrays_spec):
    """The write job asks for the full file's batch while its gate's answer is still awaited on a
    thread: answers come in the order asked, whichever is read first."""
    small, whole = written(arrays_spec, "small.beton", np.arange(8)), written(arrays_spec, "d.beton", np.arange(40))
    child = start_loader_process(arrays_spec)
    with child.kept_open():
        first, second = child.request(small, arrays_spec), child.request(whole, arrays_spec)
        assert child.pending
        assert "read 16 samples" in second.result()[1]
        assert "read 8 samples" in first.result()[1] and child.served == 2 and not child.pending
        child.close()  # what verify_beton and build do with the loader they were given
        assert child.process.poll() is None
    assert child.process.returncode == 0


def test_at_the_exit_of_kept_open_a_child_mid_batch_is_ended(arrays_spec):
    """Its answer never read, the child is busy: the exit kills it, and the answer says so."""
    good = written(arrays_spec, "d.beton", np.arange(40))
    child = start_loader_process(arrays_spec)
    with child.kept_open():
        answer = child.request(good, arrays_spec)
        child.close()
        assert child.process.poll() is None
    assert child.process.returncode is not None
    ok, detail = answer.result()
    assert not ok and "ended before it answered" in detail, detail


def test_end_ends_a_kept_open_child_at_once_and_its_awaited_answer_says_so(arrays_spec):
    """A write job interrupted mid-write ends the child without waiting for the gate's answer."""
    import threading

    good = written(arrays_spec, "d.beton", np.arange(40))
    child = start_loader_process(arrays_spec)
    with child.kept_open():
        answer, answers = child.request(good, arrays_spec), []
        waiting = threading.Thread(target=lambda: answers.append(answer.result()))
        waiting.start()  # as the smoke gate's thread awaits it
        child.end()
        waiting.join(timeout=30)
        assert child.process.returncode is not None and not waiting.is_alive()
    assert answers == [(False, "ffcv.Loader's process was ended before it answered")]
