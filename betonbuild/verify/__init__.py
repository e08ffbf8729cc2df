"""Verification of a .beton against its source: the read-back report and what it is made of.

``report`` (the checks, ``verify_beton``), ``structure`` (header-level checks), ``content`` (the
comparisons of values, on a thread pool), ``images`` (decoding stored and source images),
``loader`` (the batch through the real ``ffcv.Loader``, in a child process where it can).
"""

from betonbuild.fields.rgb_image import expected_image
from betonbuild.verify.content import CHUNK_ROWS
from betonbuild.verify.loader import LoaderProcess, start_loader_process
from betonbuild.verify.report import Report, resolve_mode, verify_beton

__all__ = [
    "CHUNK_ROWS",
    "LoaderProcess",
    "Report",
    "expected_image",
    "resolve_mode",
    "start_loader_process",
    "verify_beton",
]
