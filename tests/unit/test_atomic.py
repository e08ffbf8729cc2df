"""Unit tests of betonbuild.atomic: an output appears at its target path only when complete."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from betonbuild.atomic import (
    _alive,
    atomic_path,
    disk_full_error,
    remove_stale_temp_files,
    temp_path_for,
    write_json,
)
from betonbuild.errors import WriteError
from betonbuild.fencing import OWNER_VAR, TOKEN_VAR
from betonbuild.write.writer import disk_full_error as beton_disk_full_error


def dead_pid() -> int:
    """The pid of a process that has exited (and was reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_completed_block_renames_the_temp_file_onto_the_target(tmp_path):
    target = tmp_path / "sub" / "out.bin"
    with atomic_path(target) as tmp:
        assert tmp == temp_path_for(target) == tmp_path / "sub" / f".out.bin.tmp-{os.getpid()}"
        tmp.write_bytes(b"done")
        assert not target.exists(), "the target appears only when the block succeeds"
    assert target.read_bytes() == b"done"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.bin"]


def test_a_failed_write_leaves_no_file_at_the_target_and_no_temp_file(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError, match="encode failed"):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"partial")
            raise RuntimeError("encode failed")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_rewrite_keeps_the_previous_complete_file(tmp_path):
    target = tmp_path / "out.json"
    write_json(target, {"v": 1})
    with pytest.raises(KeyError):
        with atomic_path(target) as tmp:
            tmp.write_text("{")
            raise KeyError("x")
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_a_block_that_writes_nothing_fails_and_leaves_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        with atomic_path(tmp_path / "out.bin"):
            pass
    assert list(tmp_path.iterdir()) == []


def test_temp_files_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    target = tmp_path / "out[1].bin"  # a glob character in the name is matched literally
    dead = tmp_path / f".out[1].bin.tmp-{dead_pid()}"
    live = tmp_path / f".out[1].bin.tmp-{os.getppid()}"
    other = tmp_path / f".other.bin.tmp-{dead_pid()}"
    odd = tmp_path / ".out[1].bin.tmp-notapid"
    for path in (dead, live, other, odd):
        path.write_bytes(b"x")
    remove_stale_temp_files(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name, odd.name])
    with atomic_path(target) as tmp:  # atomic_path cleans up the same way first
        tmp.write_bytes(b"ok")
    assert target.read_bytes() == b"ok" and live.exists()


def test_alive_tells_a_running_process_from_an_ended_one():
    assert _alive(os.getpid())
    assert _alive(1)  # init; a process of another user (PermissionError) counts as alive too
    assert not _alive(dead_pid())


def test_write_json_writes_numpy_values_and_paths_with_a_final_newline(tmp_path):
    target = tmp_path / "r.json"
    write_json(target, {"n": np.int64(3), "x": np.float32(0.5), "a": np.arange(3), "p": Path("a/b")})
    text = target.read_text()
    assert text.endswith("}\n")
    assert json.loads(text) == {"n": 3, "x": 0.5, "a": [0, 1, 2], "p": "a/b"}


def test_write_json_refuses_an_unserialisable_value_and_writes_nothing(tmp_path):
    with pytest.raises(TypeError, match="object is not JSON serialisable"):
        write_json(tmp_path / "r.json", {"bad": object()})
    assert list(tmp_path.iterdir()) == []


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["json.dump", "builtins.open"])
def test_a_full_disk_while_a_json_record_is_written_is_the_disk_full_message_naming_the_path(
    tmp_path, monkeypatch, where
):
    target = tmp_path / "results" / "d" / "inspect.json"
    write_json(target, {"v": 1})
    if where == "json.dump":
        monkeypatch.setattr(json, "dump", no_space)
    else:  # the temp file cannot even be created
        monkeypatch.setattr("builtins.open", no_space)
    with pytest.raises(WriteError) as info:
        write_json(target, {"v": 2})
    monkeypatch.undo()
    assert str(info.value) == (
        f"the disk is full (or a file-size limit was reached) while writing {target}: No space left on device; "
        "free space or point `results` at a larger disk, then run again"
    )
    assert json.loads(target.read_text()) == {"v": 1}, "the previous complete record is kept"
    assert [p.name for p in target.parent.iterdir()] == ["inspect.json"], "no temp file is left"


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG, errno.EDQUOT])
def test_every_output_written_through_atomic_path_gets_the_disk_full_message(tmp_path, code):
    target = tmp_path / "preview.png"
    with pytest.raises(WriteError, match=f"while writing {target}: {os.strerror(code)}; free space"):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"partial")
            raise OSError(code, os.strerror(code))
    assert list(tmp_path.iterdir()) == []


def test_other_os_errors_pass_through_unchanged(tmp_path):
    with pytest.raises(PermissionError):
        with atomic_path(tmp_path / "out.bin"):
            raise PermissionError(errno.EACCES, "denied")


def test_the_disk_full_message_is_the_one_the_beton_write_gives():
    exc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert str(disk_full_error(exc, dataset="huge")) == str(beton_disk_full_error("huge", exc))


def test_the_file_is_fsynced_before_the_rename_and_its_directory_after(tmp_path, monkeypatch):
    """A power loss after the rename must not leave an empty or short file at the target."""
    events: list[tuple] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        events.append(("fsync", path, path.stat().st_size if path.is_file() else None))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    payload = bytes(range(256)) * 4096
    target = tmp_path / "sub" / "out.bin"
    with atomic_path(target) as tmp:
        tmp.write_bytes(payload)
    write_json(tmp_path / "sub" / "record.json", {"v": 1})
    monkeypatch.undo()
    tmp = temp_path_for(target)
    json_tmp = temp_path_for(tmp_path / "sub" / "record.json")
    assert events[:3] == [
        ("fsync", tmp, len(payload)),  # the whole content, before it gets the target's name
        ("replace", tmp, target),
        ("fsync", tmp_path / "sub", None),
    ]
    assert [e[0] for e in events[3:]] == ["fsync", "replace", "fsync"]
    assert events[3][1] == json_tmp and events[5][1] == tmp_path / "sub"
    assert target.read_bytes() == payload and json.loads((tmp_path / "sub" / "record.json").read_text()) == {"v": 1}


def test_a_failing_fsync_publishes_nothing(tmp_path, monkeypatch):
    def failing(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError, match="Input/output error"):
        with atomic_path(tmp_path / "out.bin") as tmp:
            tmp.write_bytes(b"data")
    assert list(tmp_path.iterdir()) == []


def test_a_directory_that_cannot_be_fsynced_is_not_an_error(tmp_path, monkeypatch):
    real_fsync = os.fsync

    def no_directory_fsync(fd):
        if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.EINVAL, "Invalid argument")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", no_directory_fsync)
    write_json(tmp_path / "out.json", [1])
    assert json.loads((tmp_path / "out.json").read_text()) == [1]


def owned_by(owner_file: Path, token: str | None) -> Path:
    owner_file.parent.mkdir(parents=True, exist_ok=True)
    owner_file.write_text(json.dumps({"host": "h", "pid": 1, "token": token}))
    return owner_file


def test_a_job_of_a_superseded_run_does_not_publish_and_leaves_no_temp_file(tmp_path, monkeypatch):
    owner_file = owned_by(tmp_path / ".snakemake" / "owner.json", "run-new")
    monkeypatch.setenv(TOKEN_VAR, "run-old")
    monkeypatch.setenv(OWNER_VAR, str(owner_file))
    target = tmp_path / "results" / "d" / "d.beton"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"the newer run's verified file")
    with pytest.raises(WriteError) as caught:
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"the orphan's file")
    assert str(caught.value).startswith(
        f"this job belongs to run run-old, superseded by run run-new; not publishing {target}"
    )
    assert target.read_bytes() == b"the newer run's verified file"
    assert [p.name for p in target.parent.iterdir()] == ["d.beton"]
    # The refusal is also recorded where a rerun of the job (which removes the job's log) leaves it.
    (recorded,) = (tmp_path / ".snakemake" / "betonbuild-fenced.log").read_text().splitlines()
    assert recorded.endswith(str(caught.value)) and f"pid {os.getpid()}: " in recorded


def test_a_job_whose_owner_record_is_gone_does_not_publish(tmp_path, monkeypatch):
    monkeypatch.setenv(TOKEN_VAR, "run-old")
    monkeypatch.setenv(OWNER_VAR, str(tmp_path / "gone.json"))
    with pytest.raises(WriteError, match="superseded by a newer run .*no longer names this run"):
        write_json(tmp_path / "out.json", {})
    assert [p.name for p in tmp_path.iterdir()] == ["betonbuild-fenced.log"]


def test_a_job_of_the_current_run_and_a_process_outside_any_run_publish(tmp_path, monkeypatch):
    owner_file = owned_by(tmp_path / "owner.json", "run-now")
    monkeypatch.setenv(TOKEN_VAR, "run-now")
    monkeypatch.setenv(OWNER_VAR, str(owner_file))
    write_json(tmp_path / "in-run.json", {"v": 1})
    monkeypatch.delenv(TOKEN_VAR)
    monkeypatch.delenv(OWNER_VAR)
    owned_by(owner_file, "some-other-run")
    write_json(tmp_path / "by-hand.json", {"v": 2})  # `betonbuild write` by hand has no token
    assert json.loads((tmp_path / "in-run.json").read_text()) == {"v": 1}
    assert json.loads((tmp_path / "by-hand.json").read_text()) == {"v": 2}
