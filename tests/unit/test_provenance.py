"""Unit tests of betonbuild.provenance: the fingerprint of the installed ffcv build."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import sys

import pytest

from betonbuild.provenance import BUILD_KEYS, build_differences, ffcv_build, same_build


@pytest.fixture(scope="module")
def build() -> dict:
    return ffcv_build()


def test_ffcv_build_has_every_key(build):
    assert set(build) == {
        "ffcv_distribution",
        "ffcv_module_version",
        "libffcv_sha256",
        "libffcv_file",
        "numpy",
        "python",
        "python_executable",
    }
    assert set(BUILD_KEYS) <= set(build)


def test_ffcv_distribution_is_the_pinned_release(build):
    assert build["ffcv_distribution"] == "1.0.2"


def test_module_version_is_the_label_ffcv_prints(build):
    # ffcv 1.0.2 calls itself 0.0.3rc1: the reason a label alone does not identify a build.
    assert build["ffcv_module_version"] == "0.0.3rc1"


def test_libffcv_sha256_is_the_digest_of_the_compiled_extension(build):
    assert re.fullmatch(r"[0-9a-f]{64}", build["libffcv_sha256"])
    assert build["libffcv_file"].startswith("_libffcv") and build["libffcv_file"].endswith(".so")
    import importlib.util

    package_dir = list(importlib.util.find_spec("ffcv").submodule_search_locations)[0]
    candidates = [
        os.path.join(package_dir, build["libffcv_file"]),
        os.path.join(os.path.dirname(package_dir), build["libffcv_file"]),
    ]
    path = next(p for p in candidates if os.path.isfile(p))
    with open(path, "rb") as fh:
        assert hashlib.sha256(fh.read()).hexdigest() == build["libffcv_sha256"]


def test_numpy_and_python_are_this_process(build):
    assert build["numpy"] == importlib.metadata.version("numpy")
    assert build["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert build["python_executable"] == sys.executable


def test_ffcv_build_does_not_import_ffcv():
    import subprocess

    code = "import sys; from betonbuild.provenance import ffcv_build; ffcv_build(); print('ffcv' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    assert result.stdout.strip() == "False"


def test_same_build_is_true_for_itself_and_ignores_the_executable_path(build):
    other = dict(build, python_executable="/somewhere/else/bin/python")
    assert same_build(build, dict(build))
    assert same_build(build, other)
    assert build_differences(build, other) == []


@pytest.mark.parametrize("key", BUILD_KEYS)
def test_any_build_key_difference_is_reported(build, key):
    other = dict(build, **{key: "something-else"})
    assert not same_build(build, other)
    assert build_differences(build, other) == [f"{key}: written by {build[key]!r}, read by 'something-else'"]


def test_build_differences_lists_every_difference_and_missing_keys(build):
    writer = dict(build, libffcv_sha256="0" * 64, numpy="1.26.4")
    reader = {k: v for k, v in build.items() if k != "ffcv_module_version"}
    differences = build_differences(writer, reader)
    assert differences == [
        f"ffcv_module_version: written by {build['ffcv_module_version']!r}, read by None",
        f"libffcv_sha256: written by {'0' * 64!r}, read by {build['libffcv_sha256']!r}",
        f"numpy: written by '1.26.4', read by {build['numpy']!r}",
    ]
    assert not same_build(writer, reader)
