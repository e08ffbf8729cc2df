"""One side of benchmark 11: decode a .beton through ffcv's Loader, or write one, in-process timed.

    kinds.py decode FILE FIELD WORKERS BATCH [betonbuild]   one epoch (after an untimed one: the compile)
    kinds.py write ragged|padded DATA.npz OUT WORKERS

The betonbuild cases need betonbuild on PYTHONPATH (the measured tree): ``loader_fields`` registers
its classes; ffcv's own fields need nothing. Prints JSON: seconds, samples, checksum (the sum of
every decoded value, padding zeros included, so both sides of a pair can be compared with the data).
"""

import json
import sys
import time

import numpy as np


def decode(path: str, field: str, workers: int, batch: int, ours: bool) -> dict:
    from ffcv.loader import Loader, OrderOption

    custom = {}
    if ours:  # plain ffcv's sides import nothing of betonbuild
        from betonbuild.loading import loader_fields

        custom = loader_fields(path)
    loader = Loader(
        path,
        batch_size=batch,
        num_workers=workers,
        order=OrderOption.SEQUENTIAL,
        drop_last=False,
        custom_fields=custom,
    )
    index = list(loader.reader.handlers).index(field)
    checksum = 0
    for out in loader:  # untimed: compiles the pipeline (numba) and sums what it decodes
        checksum += int(np.asarray(out[index]).sum(dtype=np.int64))
    started = time.monotonic()
    samples = 0
    for out in loader:
        samples += len(out[index])
    seconds = time.monotonic() - started
    return {"seconds": round(seconds, 4), "samples": samples, "checksum": checksum}


def write(kind: str, data: str, out: str, workers: int) -> dict:
    from ffcv.fields import NDArrayField
    from ffcv.writer import DatasetWriter

    arrays = np.load(data)
    flat, offsets = arrays["flat"], arrays["offsets"]
    longest = int(np.diff(offsets).max())

    class Ragged:
        def __len__(self):
            return len(offsets) - 1

        def __getitem__(self, i):
            value = flat[offsets[i] : offsets[i + 1]]
            if kind == "padded":
                padded = np.zeros(longest, flat.dtype)
                padded[: value.size] = value
                return (padded,)
            return (value,)

    if kind == "ragged":
        from betonbuild.fields.ragged_field import RaggedArrayField

        field = RaggedArrayField(flat.dtype.str, 1, longest)
    else:
        field = NDArrayField(flat.dtype, (longest,))
    started = time.monotonic()
    DatasetWriter(out, {"x": field}, num_workers=workers).from_indexed_dataset(Ragged(), chunksize=1000)
    return {"seconds": round(time.monotonic() - started, 4), "samples": len(offsets) - 1, "checksum": int(flat.sum())}


if __name__ == "__main__":
    if sys.argv[1] == "decode":
        result = decode(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6:] == ["betonbuild"])
    else:
        result = write(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    print(json.dumps(result))
