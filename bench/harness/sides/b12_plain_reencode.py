"""Plain ffcv re-encoding JPEG bytes (no betonbuild import): each image decoded with PIL, then
written by ``RGBImageField(write_mode="jpg")``, as a user without betonbuild turns a Hugging Face
``Image`` column into a .beton.

    b12_plain_reencode.py IMAGES.parquet OUT.beton WORKERS

The column ``image.bytes`` and ``label`` are read whole with pyarrow before the clock starts.
Prints the in-process write seconds as JSON.
"""

import io
import json
import sys
import time

import numpy as np
import pyarrow.parquet as pq
from ffcv.fields import IntField, RGBImageField
from ffcv.writer import DatasetWriter
from PIL import Image


class Images:
    def __init__(self, path: str):
        table = pq.read_table(path, columns=["image", "label"])
        self.jpegs = table.column("image").combine_chunks().field("bytes").to_pylist()
        self.labels = table.column("label").to_numpy()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        image = Image.open(io.BytesIO(self.jpegs[index]))
        return np.asarray(image.convert("RGB")), int(self.labels[index])


def main() -> None:
    path, out, workers = sys.argv[1:4]
    images = Images(path)
    fields = {"image": RGBImageField(write_mode="jpg"), "label": IntField()}
    started = time.monotonic()
    DatasetWriter(out, fields, num_workers=int(workers)).from_indexed_dataset(images)
    print(json.dumps({"seconds": round(time.monotonic() - started, 3), "samples": len(images)}))


if __name__ == "__main__":
    main()
