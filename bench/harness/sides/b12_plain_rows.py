"""Plain ffcv writing int + float + 64 x float32 rows from in-memory numpy arrays (no betonbuild import).

    b12_plain_rows.py ROWS.npz OUT.beton WORKERS

``id`` IntField, ``score`` FloatField, ``vec`` NDArrayField(float32, (64,)) from the arrays of
ROWS.npz, loaded whole before the clock starts; ``DatasetWriter(num_workers=WORKERS)
.from_indexed_dataset``. Prints the in-process write seconds as JSON (imports and loading excluded).
"""

import json
import sys
import time

import numpy as np
from ffcv.fields import FloatField, IntField, NDArrayField
from ffcv.writer import DatasetWriter


class Rows:
    def __init__(self, path: str):
        with np.load(path) as data:
            self.id, self.score, self.vec = data["id"], data["score"], data["vec"]

    def __len__(self):
        return len(self.id)

    def __getitem__(self, index):
        return int(self.id[index]), float(self.score[index]), self.vec[index]


def main() -> None:
    path, out, workers = sys.argv[1:4]
    rows = Rows(path)
    fields = {"id": IntField(), "score": FloatField(), "vec": NDArrayField(dtype=np.dtype("float32"), shape=(64,))}
    started = time.monotonic()
    DatasetWriter(out, fields, num_workers=int(workers)).from_indexed_dataset(rows)
    print(json.dumps({"seconds": round(time.monotonic() - started, 3), "samples": len(rows)}))


if __name__ == "__main__":
    main()
