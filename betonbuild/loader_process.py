"""The child process that runs a dataset's Loader batch (``betonbuild.verify.loader.check_loader_batch``):
started at once, it imports ffcv (torch, 2-3 s of one core) and waits for the file to read.

Apart from the rest of ``betonbuild.verify`` so that a job script can start it before it imports
betonbuild's own modules (numpy, jsonschema, the stages: 0.4-0.5 s of the job's first core): the
smoke gate waits for this child's import, and the full write after it in the same job finds ffcv
imported already. This module imports nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from betonbuild.config.spec import DatasetSpec


class LoaderProcess:
    """``check_loader_batch`` in a child process of the same Python, with this one's ``sys.path``
    and working directory. ``request`` sends it a file (once the structural checks allow ffcv's
    Loader to read it) and returns a ``LoaderAnswer``, whose ``result`` waits for its (ok, detail);
    ``close`` ends it. A crash of ffcv's Loader (it reads pointers unchecked) fails the check, not
    the whole report.

    One child can run several batches, in the order they were asked (one JSON line each way): a
    write job that gates on its smoke file and then writes the full one imports ffcv once for both
    batches, and may ask for the second before it read the first answer (the gate's answer is
    awaited on a thread during the full write). Answers are read under a lock, from any thread.
    Under ``kept_open`` its users' ``close`` leaves it waiting for the next request."""

    def __init__(self, process: subprocess.Popen, stderr):
        self.process, self.stderr = process, stderr
        self.sent = 0  # requests written
        self.answers: list[tuple[bool, str]] = []  # read so far, in the order they were asked
        self.reading = threading.Lock()
        self.kept = False
        self.killed = False  # by close(), mid-batch

    @property
    def pending(self) -> bool:
        """A request sent whose answer was not read yet: the child is busy."""
        return self.sent > len(self.answers)

    @property
    def served(self) -> int:
        return len(self.answers)

    @classmethod
    def start(cls) -> LoaderProcess | None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
        stderr = tempfile.TemporaryFile()
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", "from betonbuild.verify.loader import loader_child; loader_child()"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
            )
        except (OSError, ValueError):
            stderr.close()
            return None
        return cls(process, stderr)

    def request(self, path: str, spec: DatasetSpec) -> LoaderAnswer:
        number, self.sent = self.sent, self.sent + 1
        try:
            self.process.stdin.write(json.dumps({"path": path, "spec": spec.to_dict()}).encode() + b"\n")
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # it ended already: its answer says how
        return LoaderAnswer(self, number)

    def answer(self, number: int) -> tuple[bool, str]:
        """The answer to request ``number``, reading (and keeping) the answers before it."""
        with self.reading:
            while len(self.answers) <= number:
                self.answers.append(self._read_answer())
        return self.answers[number]

    def _read_answer(self) -> tuple[bool, str]:
        """The next answer line; other lines on stdout (ffcv's or numba's prints) are passed over."""
        for line in iter(self.process.stdout.readline, b""):
            try:
                answer = json.loads(line.decode(errors="replace"))
                return bool(answer["ok"]), str(answer["detail"])
            except (ValueError, KeyError, TypeError):
                continue
        self.process.wait()
        if self.process.returncode == -signal.SIGKILL and self.killed:
            return False, "ffcv.Loader's process was ended before it answered"
        self.stderr.seek(0)
        errors = self.stderr.read().decode(errors="replace").strip()
        tail = errors.splitlines()[-1] if errors else "no error output"
        return False, f"ffcv.Loader's process ended with exit code {self.process.returncode}: {tail}"

    @contextlib.contextmanager
    def kept_open(self):
        """Within: its users' ``close`` leaves the child running for the next request (one asked
        meanwhile waits its turn). At the exit it is ended: killed if an answer is still unread."""
        self.kept = True
        try:
            yield self
        finally:
            self.kept = False
            self.end()

    def close(self) -> None:
        """Ends the child: at once if it was never asked or is mid-batch (an answer unread), else by
        closing its stdin (it then exits). Kept open (``kept_open``), it is left running. An answer
        still awaited (on another thread too) then says the process ended before it answered."""
        if not self.kept:
            self.end()

    def end(self) -> None:
        """``close``, kept open or not (a job interrupted mid-write does not wait for an answer)."""
        running = self.process.poll() is None
        if running and (self.pending or not self.served):
            self.killed = True
            self.process.kill()
        with contextlib.suppress(OSError, ValueError):
            if self.process.stdin is not None:
                self.process.stdin.close()  # an idle child reads EOF and exits
        self.process.wait()
        if self.sent:
            self.answer(self.sent - 1)  # every answer read: the killed child's say it ended first
        for stream in (self.process.stdin, self.process.stdout, self.stderr):
            if stream is not None:
                stream.close()


class LoaderAnswer:
    """The answer to one ``LoaderProcess.request``: ``result`` waits for it."""

    def __init__(self, child: LoaderProcess, number: int):
        self.child, self.number = child, number

    def result(self) -> tuple[bool, str]:
        return self.child.answer(self.number)
