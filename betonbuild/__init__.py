"""betonbuild: datasets to validated FFCV .beton files, built by Snakemake."""

from betonbuild._compat.ast_parse import install as _install_locked_ast_parse
from betonbuild._compat.ffcv_import import install as _install_fast_ffcv_import

_install_fast_ffcv_import()
_install_locked_ast_parse()

# What training code calls to read betonbuild's own field kinds (``betonbuild.loading``); loaded on
# first use, so that ``import betonbuild`` (the CLI's --help, the DAG) imports no numpy.
_READING = ("loader_fields", "loader_pipelines", "unpad", "texts")
__all__ = list(_READING)


def __getattr__(name: str):
    if name in _READING:
        from betonbuild import loading  # why local: it imports numpy, which the DAG does not need

        return getattr(loading, name)
    raise AttributeError(f"module 'betonbuild' has no attribute {name!r}")
