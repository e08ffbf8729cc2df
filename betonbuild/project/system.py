"""What ffcv needs from the operating system, said where the user sees it: before a run starts."""

from __future__ import annotations

DEBIAN_PACKAGES = ("libopencv-dev", "libturbojpeg0-dev", "pkg-config")
APT_LINE = "sudo apt-get update && sudo apt-get install -y --no-install-recommends " + " ".join(DEBIAN_PACKAGES)
REBUILD_LINE = "pip install --force-reinstall --no-deps --no-cache-dir ffcv==1.0.2"


def ffcv_problem() -> str | None:
    """Why ffcv cannot run here (not installed, or its compiled library does not load), with the fix; or None.

    Checked through ctypes, without importing ffcv (which imports torch): a missing libturbojpeg or
    OpenCV shared library shows up as the compiled extension failing to load.
    """
    # why local: the ctypes module imports numpy, which `betonbuild --help` need not import
    from betonbuild._compat.ffcv_ctypes import libffcv_problem

    problem = libffcv_problem()
    if problem is None:
        return None
    return (
        f"ffcv cannot run here: {problem}. ffcv compiles against OpenCV and libjpeg-turbo; install the "
        f"system packages (Debian/Ubuntu):\n  {APT_LINE}\nthen build ffcv again:\n  {REBUILD_LINE}"
    )
