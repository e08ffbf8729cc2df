"""The benchmark harness behind `make bench`: every speed claim of betonbuild, side by side.

Run ``python -m bench.harness --help`` from the repository root. ``runner`` measures processes from
outside, ``data`` prepares the inputs once under ``bench/cache/harness/``, ``report`` writes
``bench/results.json`` and the table in ``bench/RESULTS.md``; one module per benchmark
(``b1_jpeg_write`` ... ``b9_scale``), each a ``run(ctx) -> dict``.
"""
