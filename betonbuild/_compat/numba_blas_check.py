"""numba's check for a BLAS skipped in the Loader batch's child process, where nothing uses one.

numba 0.68.1 initialises its CPU target on the first compile or cache load of a process (every
Loader: ffcv compiles its reader and decoders there), and that imports ``numba.np.arraymath``, whose
``_HAVE_BLAS = _check_blas()`` imports ``scipy.linalg`` (scipy is installed here for scikit-image
and scikit-learn): 0.38 s of a 1.1-1.4 s Loader batch, measured in the smoke job's child, which the
smoke job waits for. Without that module numba only leaves ``np.dot`` and friends uncompiled in
nopython code; the Loader batch's child runs ffcv's built-in decoders and betonbuild's own kinds,
none of which use them (a ``type: custom`` field's decoder runs its batch in the job's own
process, never here: ``betonbuild.verify.loader.content_without_ffcv``).
"""

from __future__ import annotations

import sys

from betonbuild._compat import Checked

CHECKED = (
    Checked(
        "numba",
        "0.68.1",
        why="numba.np.linalg.ensure_blas imports scipy.linalg.cython_blas at target initialisation; "
        "made an ImportError in the Loader child (0.38 s of its batch), where no decoder needs BLAS",
    ),
)

BLAS_MODULE = "scipy.linalg.cython_blas"  # what numba.np.linalg.ensure_blas imports


def skip_blas_check() -> None:
    """From now on in this process, importing ``scipy.linalg.cython_blas`` fails at once (without
    importing scipy.linalg first), so numba's check finds no BLAS. Only for a process that will
    compile nothing that calls BLAS, and only if scipy.linalg is not imported already."""
    if "scipy.linalg" not in sys.modules:
        sys.modules.setdefault(BLAS_MODULE, None)  # None in sys.modules: ModuleNotFoundError, parents untouched
