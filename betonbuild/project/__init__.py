"""A project outside this repository: ``betonbuild init`` writes one, ``betonbuild run`` builds it.

A project is a directory with a ``config.yaml``; it is the working directory of the packaged
workflow (data paths, ``results/``, ``logs/`` and the user's adapter modules are relative to it).
"""
