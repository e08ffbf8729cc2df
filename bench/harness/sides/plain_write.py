"""Side A of the array benchmarks: plain ffcv, as its documentation writes a dataset (no betonbuild).

    plain_write.py IMAGES.npy LABELS.npy OUT.beton WORKERS jpg|raw [COUNT]

jpg: ``image`` RGBImageField(write_mode='jpg', jpeg_quality=90); raw: ``image`` NDArrayField(uint8,
HxWx3); both + ``label`` IntField, from the memory-mapped .npy, ``DatasetWriter(num_workers=WORKERS)``.
Prints the in-process write time as JSON (imports excluded) for the "where the time goes" notes.
"""

import json
import sys
import time

import numpy as np
from ffcv.fields import IntField, NDArrayField, RGBImageField
from ffcv.writer import DatasetWriter


class Crops:
    def __init__(self, images: str, labels: str):
        self.images = np.load(images, mmap_mode="r")
        self.labels = np.load(labels, mmap_mode="r")

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.images[index], int(self.labels[index])


def main() -> None:
    images, labels, out, workers, mode = sys.argv[1:6]
    dataset = Crops(images, labels)
    count = int(sys.argv[6]) if len(sys.argv) > 6 else len(dataset)
    if mode == "jpg":
        image = RGBImageField(write_mode="jpg", jpeg_quality=90)
    else:
        image = NDArrayField(dtype=np.dtype("uint8"), shape=dataset.images.shape[1:])
    started = time.monotonic()
    writer = DatasetWriter(out, {"image": image, "label": IntField()}, num_workers=int(workers))
    writer.from_indexed_dataset(dataset, indices=list(range(count)))
    print(json.dumps({"seconds": round(time.monotonic() - started, 3)}))


if __name__ == "__main__":
    main()
