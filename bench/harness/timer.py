"""Runs one command and prints its wall time, CPU time and peak RSS as JSON: the harness's stopwatch.

    python -I -S timer.py STDOUT_FILE STDERR_FILE CWD COMMAND...

Why a separate, tiny process: Linux carries the RSS high-water mark of the process image that
calls exec() into the new program's ``ru_maxrss``. A child spawned directly by the harness, which has
imported numpy and ffcv, would report at least the harness's own ~450 MiB. Forked from this
stdlib-only process, the floor is this process's ~7 MiB. The clock runs from fork to reaped
(``os.wait4``), so the command's interpreter start-up, imports and exit all count.
"""

import json
import os
import sys
import time


def main() -> None:
    out, err, cwd, *command = sys.argv[1:]
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    stdout, stderr = os.open(out, flags, 0o644), os.open(err, flags, 0o644)
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.chdir(cwd)
            os.dup2(stdout, 1)
            os.dup2(stderr, 2)
            os.execvp(command[0], command)
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    seconds = time.monotonic() - started
    print(
        json.dumps(
            {
                "seconds": seconds,
                "exit": os.waitstatus_to_exitcode(status),
                "cpu_seconds": usage.ru_utime + usage.ru_stime,
                "max_rss_kib": usage.ru_maxrss,
            }
        )
    )


if __name__ == "__main__":
    main()
