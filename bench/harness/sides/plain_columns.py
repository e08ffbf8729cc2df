"""Plain ffcv on ``.npy`` columns, as its documentation writes a dataset (no betonbuild import).

    plain_columns.py X.npy LABEL.npy OUT.beton WORKERS CHUNKSIZE

``x`` NDArrayField(X's dtype and row shape) + ``label`` IntField from the memory-mapped columns,
``DatasetWriter(num_workers=WORKERS).from_indexed_dataset(chunksize=CHUNKSIZE)``. Prints the
in-process write seconds as JSON (imports excluded).
"""

import json
import sys
import time

import numpy as np
from ffcv.fields import IntField, NDArrayField
from ffcv.writer import DatasetWriter


class Columns:
    def __init__(self, x: str, label: str):
        self.x = np.load(x, mmap_mode="r")
        self.label = np.load(label, mmap_mode="r")

    def __len__(self):
        return len(self.label)

    def __getitem__(self, index):
        return self.x[index], int(self.label[index])


def main() -> None:
    x, label, out, workers, chunksize = sys.argv[1:6]
    dataset = Columns(x, label)
    fields = {"x": NDArrayField(dtype=dataset.x.dtype, shape=dataset.x.shape[1:]), "label": IntField()}
    started = time.monotonic()
    DatasetWriter(out, fields, num_workers=int(workers)).from_indexed_dataset(dataset, chunksize=int(chunksize))
    print(json.dumps({"seconds": round(time.monotonic() - started, 3), "samples": len(dataset)}))


if __name__ == "__main__":
    main()
