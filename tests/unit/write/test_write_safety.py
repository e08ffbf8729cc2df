"""The writer can neither hang nor leave a partial file, whatever its workers do."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from betonbuild.errors import BetonbuildError
    from betonbuild.config.load import load_config
    from betonbuild.write.writer import write_beton

    class Dataset:
        def __len__(self):
            return 200_000

        def __getitem__(self, i):
            if i == int(sys.argv[2]):
                {action}
            return (np.zeros(4, dtype=np.uint8),)

    spec = load_config({{"datasets": {{"d": {{
        "source": {{"kind": "python", "factory": "x:y"}},
        "fields": {{"x": {{"type": "ndarray", "dtype": "uint8", "shape": [4]}}}},
        "writer": {{"chunksize": 1}},
    }}}}}}).datasets["d"]
    try:
        write_beton(spec, Dataset(), np.arange(200_000), sys.argv[1], num_workers=2)
    except BetonbuildError as exc:
        print("ERROR:", exc)
        sys.exit(1)
    """
)


@pytest.mark.parametrize(
    "action, expected",
    [
        ("raise ValueError('boom')", "sample index 3: the source's __getitem__ raised ValueError: boom"),
        ("os._exit(3)", "a writer worker died without reporting an error (exit code 3)"),
        ("os.kill(os.getpid(), 9)", "killed by signal 9 (SIGKILL)"),
    ],
)
def test_a_failing_worker_with_a_full_work_queue_ends_the_write_promptly(tmp_path, action, expected):
    """200,000 one-sample work items stay queued when a worker fails at once: the parent must not
    wait at exit for its queue's feeder thread, nor spin on the dead worker."""
    script = tmp_path / "write.py"
    script.write_text(SCRIPT.format(action=action))
    target = tmp_path / "out.beton"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(script), str(target), "3"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert time.monotonic() - started < 30
    assert result.returncode == 1, result.stderr[-3000:]
    assert expected in result.stdout
    assert "dataset 'd'" in result.stdout
    assert not target.exists()
    assert not list(tmp_path.glob(".out.beton.tmp-*"))


def test_our_errors_cross_a_process_boundary_whole():
    """A writer worker's error reaches the parent pickled: every field must come back."""
    import pickle

    from betonbuild.errors import ConfigError, SampleError, SourceError

    for error in (
        SourceError("d", "the shard list is gone"),
        ConfigError("datasets.d.fields", "empty"),
        SampleError("d", "image", 3, "too big", "raise page_size", "shard s/p-0.tar, key k"),
    ):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error) and vars(back) == vars(error)


def test_a_process_forked_during_a_write_dies_of_sigterm_instead_of_raising_in_the_parents_stack():
    """A worker that gets SIGTERM between fork and setting its own handler (the parent ending the
    workers right after starting them) must die of it; raising WriteInterrupted there would unwind
    a copy of the parent's stack, here pytest's, in the child."""
    import os
    import signal

    from betonbuild.write.writer import _signals_raise

    with _signals_raise():
        pid = os.fork()
        if pid == 0:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            finally:
                os._exit(3)  # reached only when the handler raised
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status


def test_what_the_watch_raises_ends_the_write_and_leaves_no_file(tmp_path):
    """The smoke gate's Loader batch, failing during the full write (``write_beton``'s ``watch``):
    the workers are ended, the error is the watch's, and nothing is left at the target."""
    import multiprocessing

    import numpy as np

    from betonbuild.config.load import load_config
    from betonbuild.errors import VerificationError
    from betonbuild.write.writer import write_beton

    entry = {
        "source": {"kind": "python", "factory": "x:y"},
        "fields": {"x": {"type": "ndarray", "dtype": "uint8", "shape": [4]}},
        "writer": {"chunksize": 1},
    }
    spec = load_config({"datasets": {"d": entry}}).datasets["d"]
    calls = []

    def gate_failed():
        calls.append(time.monotonic())
        if len(calls) == 3:
            raise VerificationError("the gate's Loader batch failed")

    rows = np.zeros((200_000, 4), dtype=np.uint8)
    target = tmp_path / "out.beton"
    started = time.monotonic()
    with pytest.raises(VerificationError, match="Loader batch failed"):
        write_beton(
            spec,
            [(row,) for row in rows],
            np.arange(len(rows)),
            target,
            2,
            log=open("/dev/null", "w"),
            watch=gate_failed,
        )
        pytest.fail("the write ran to its end")  # 200,000 one-sample items: far more than 3 polls
    assert time.monotonic() - started < 30 and len(calls) == 3
    assert not target.exists() and not list(tmp_path.glob(".out.beton.tmp-*"))
    assert not multiprocessing.active_children()
