"""Plain ffcv on an image folder, as a user writes it without betonbuild (no betonbuild import).

    plain_folder.py ROOT OUT.beton WORKERS [CHUNKSIZE]

Lists ``ROOT/<class>/<file>`` (classes: the sorted folder names, files sorted by name, as
torchvision's ImageFolder does), opens each image with PIL and ``.convert("RGB")``, and writes
``image`` RGBImageField(jpg, q90) + ``label`` IntField with ``DatasetWriter(num_workers=WORKERS)``.
Prints the in-process seconds (listing + write, imports excluded) as JSON.
"""

import json
import os
import sys
import time

from ffcv.fields import IntField, RGBImageField
from ffcv.writer import DatasetWriter
from PIL import Image


class Folder:
    def __init__(self, root: str):
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.items = [
            (os.path.join(root, name, file), label)
            for label, name in enumerate(classes)
            for file in sorted(os.listdir(os.path.join(root, name)))
        ]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        path, label = self.items[index]
        with Image.open(path) as image:
            return image.convert("RGB"), label


def main() -> None:
    root, out, workers = sys.argv[1:4]
    chunksize = int(sys.argv[4]) if len(sys.argv) > 4 else 100
    started = time.monotonic()
    dataset = Folder(root)
    fields = {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()}
    DatasetWriter(out, fields, num_workers=int(workers)).from_indexed_dataset(dataset, chunksize=chunksize)
    print(json.dumps({"seconds": round(time.monotonic() - started, 3), "samples": len(dataset)}))


if __name__ == "__main__":
    main()
