"""Shared by the tests of betonbuild.verify: the checks a full report of every field kind holds, in order."""

ALL_CHECKS = [
    "format_version",
    "num_samples",
    "fields",
    "allocations",
    "fixed_fields",
    "variable_fields",
    "custom_fields",
    "image_decoder",
    "loader_batch",
    "same_ffcv_build",
]
