"""Inputs that convert without loss are accepted (issue 17, item 12), and the file holds exactly their value.

Each accepted conversion is written to a real .beton by betonbuild's writer, read back with the
bounds-checked reader (``BetonFile``) and verified (``verify_beton``, with its ffcv Loader batch):
the stored value is the source's, and verification, comparing with the converted value, passes.
The refusals of what does not convert without loss are in ``test_samples.py``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from betonbuild.beton.format import BetonFile
from betonbuild.config.load import load_config
from betonbuild.provenance import ffcv_build
from betonbuild.sources import open_source
from betonbuild.verify import verify_beton
from betonbuild.write.writer import write_beton

# numba's dispatcher finalizer raises KeyError when ffcv.Loader objects are collected (ffcv 1.0.2, harmless).

N = 6

ADAPTER = textwrap.dedent(
    """
    import numpy as np
    import torch


    class Lossless:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return {
                "int_tensor": torch.tensor(7 * i - 9),
                "int_array": np.array(-(2**40) * i, dtype=np.int64),
                "int_float": 3.0 * i - 6.0,
                "int_float32": np.float32(1024.0 * i),
                "float_tensor": torch.tensor(i / 4 + 0.1),
                "float_array": np.array(i / 3, dtype=np.float32),
                "blob": np.arange(-3, i + 1, dtype=np.int8),
                "mask": np.array([[i % 2 == 0, True, False], [False, i % 3 == 0, True]]),
                "tmask": torch.tensor([i % 2 == 1, True, False]),
            }


    def make():
        return Lossless()
    """
)

FIELDS = {
    "int_tensor": {"type": "int"},
    "int_array": {"type": "int"},
    "int_float": {"type": "int"},
    "int_float32": {"type": "int"},
    "float_tensor": {"type": "float"},
    "float_array": {"type": "float"},
    "blob": {"type": "bytes"},
    "mask": {"type": "ndarray", "dtype": "uint8", "shape": [2, 3]},
    "tmask": {"type": "torch_tensor", "dtype": "uint8", "shape": [3]},
}


def expected(name: str, i: int):
    """The value the file must hold for sample i: the source value, converted without loss."""
    return {
        "int_tensor": 7 * i - 9,
        "int_array": -(2**40) * i,
        "int_float": 3 * i - 6,
        "int_float32": 1024 * i,
        "float_tensor": float(torch.tensor(i / 4 + 0.1)),  # the float32 tensor's value, exactly
        "float_array": float(np.float32(i / 3)),
        "blob": np.arange(-3, i + 1, dtype=np.int8).tobytes(),
        "mask": [[int(i % 2 == 0), 1, 0], [0, int(i % 3 == 0), 1]],
        "tmask": [int(i % 2 == 1), 1, 0],
    }[name]


def stored(beton: BetonFile, name: str, i: int):
    if FIELDS[name]["type"] in ("int", "float"):
        return beton.metadata[name][i].item()
    if name == "blob":
        return bytes(beton.variable_payload(name, i))
    return beton.ndarray_column(name, np.array([i]))[0].tolist()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("lossless")
    (root / "lossless_adapter.py").write_text(ADAPTER)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        patch.syspath_prepend(str(root))
        spec = load_config(
            {
                "datasets": {
                    "lossless": {
                        "source": {"kind": "python", "factory": "lossless_adapter:make"},
                        "fields": FIELDS,
                        "verify": {"mode": "full"},
                    }
                }
            }
        ).datasets["lossless"]
        source = open_source(spec)
        rows = np.arange(N)
        path = root / "lossless.beton"
        with open("/dev/null", "w") as log:
            write_beton(spec, source, rows, path, 1, log=log)
        yield spec, source, rows, path


@pytest.mark.parametrize("name", list(FIELDS))
def test_every_accepted_conversion_is_stored_exactly(written, name):
    _, _, _, path = written
    beton = BetonFile(path)
    for i in range(N):
        found, want = stored(beton, name, i), expected(name, i)
        assert found == want, f"sample {i}: stored {found!r}, expected {want!r}"
        if FIELDS[name]["type"] == "int":
            assert type(found) is int


def test_the_file_stores_the_field_dtypes_of_the_config(written):
    _, _, _, path = written
    beton = BetonFile(path)
    assert beton.metadata["int_float"].dtype == np.dtype("<i8")
    assert beton.metadata["float_array"].dtype == np.dtype("<f8")
    assert beton.ndarray_column("mask", np.arange(N)).dtype == np.uint8
    assert beton.ndarray_column("tmask", np.arange(N)).dtype == np.uint8


def test_verification_compares_the_converted_values_and_passes(written):
    spec, source, rows, path = written
    report = verify_beton(spec, source, rows, str(path), ffcv_build())
    assert report["ok"], report["worst"]
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["fixed_fields"]["fields"] == {
        name: {"compared": N, "mismatches": 0} for name in FIELDS if name != "blob"
    }
    assert checks["variable_fields"]["fields"]["blob"]["compared"] == N
    assert checks["loader_batch"]["ok"], checks["loader_batch"]["detail"]


def test_an_arrays_source_of_whole_floats_bools_and_int8_rows_is_written_and_verified(tmp_path: Path):
    # Verification of an arrays source compares the raw columns, vectorised: the stored values equal them too.
    whole = np.array([0.0, -3.0, 2.0**52, 7.0])
    masks = np.array([[True, False], [False, False], [True, True], [False, True]])
    rows8 = np.array([[-1, 0, 1], [-128, 127, 5], [2, 2, 2], [0, 0, -7]], dtype=np.int8)
    np.savez(tmp_path / "cols.npz", whole=whole, masks=masks, rows8=rows8)
    spec = load_config(
        {
            "datasets": {
                "cols": {
                    "source": {
                        "kind": "arrays",
                        "path": str(tmp_path / "cols.npz"),
                        "columns": {"label": "whole", "mask": "masks", "raw": "rows8"},
                    },
                    "fields": {
                        "label": {"type": "int"},
                        "mask": {"type": "ndarray", "dtype": "uint8", "shape": [2]},
                        "raw": {"type": "bytes"},
                    },
                    "verify": {"mode": "full"},
                }
            }
        }
    ).datasets["cols"]
    source = open_source(spec)
    rows = np.arange(4)
    with open("/dev/null", "w") as log:
        write_beton(spec, source, rows, tmp_path / "cols.beton", 1, log=log)
    beton = BetonFile(tmp_path / "cols.beton")
    assert beton.metadata["label"].tolist() == [0, -3, 2**52, 7]
    assert beton.ndarray_column("mask", rows).tolist() == masks.astype(np.uint8).tolist()
    assert [bytes(beton.variable_payload("raw", i)) for i in rows] == [r.tobytes() for r in rows8]
    report = verify_beton(spec, source, rows, str(tmp_path / "cols.beton"), ffcv_build())
    assert report["ok"], report["worst"]
