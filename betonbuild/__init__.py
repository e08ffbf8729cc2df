"""betonbuild: datasets to validated FFCV .beton files, built by Snakemake."""

from betonbuild._compat.ffcv_import import install as _install_fast_ffcv_import

_install_fast_ffcv_import()
