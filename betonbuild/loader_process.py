"""The child process that runs a dataset's Loader batch (``betonbuild.verify.loader.check_loader_batch``):
started at once, it imports ffcv (torch, 2-3 s of one core) and waits for the file to read.

Apart from the rest of ``betonbuild.verify`` so that a job script can start it before it imports
betonbuild's own modules (numpy, jsonschema, the stages: 0.4-0.5 s of the job's first core): the
smoke job is bound by this child's import, and the full write's child competes with the writer's
workers for the cores once they run. This module imports nothing but the standard library.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from betonbuild.config.spec import DatasetSpec


class LoaderProcess:
    """``check_loader_batch`` in a child process of the same Python, with this one's ``sys.path``
    and working directory. ``request`` sends it the file (once the structural checks allow ffcv's
    Loader to read it), ``result`` waits for its (ok, detail), ``close`` ends it if still running.
    A crash of ffcv's Loader (it reads pointers unchecked) fails the check, not the whole report."""

    def __init__(self, process: subprocess.Popen, stderr):
        self.process, self.stderr, self.answer = process, stderr, None

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

    def request(self, path: str, spec: DatasetSpec) -> LoaderProcess:
        try:
            with self.process.stdin:
                self.process.stdin.write(json.dumps({"path": path, "spec": spec.to_dict()}).encode())
        except BrokenPipeError:
            pass  # it ended already: result() reports how
        self.process.stdin = None  # closed: communicate() must not flush it
        return self

    def result(self) -> tuple[bool, str]:
        if self.answer is None:
            out, _ = self.process.communicate()
            self.stderr.seek(0)
            errors = self.stderr.read().decode(errors="replace").strip()
            try:
                answer = json.loads(out.decode().strip().splitlines()[-1])
                self.answer = bool(answer["ok"]), str(answer["detail"])
            except (ValueError, KeyError, TypeError, IndexError):
                tail = errors.splitlines()[-1] if errors else "no error output"
                self.answer = False, f"ffcv.Loader's process ended with exit code {self.process.returncode}: {tail}"
        return self.answer

    def close(self) -> None:
        """Kills the child unless its answer was read (a report that ended before the Loader batch)."""
        if self.answer is None and self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.stderr):
            if stream is not None:
                stream.close()
