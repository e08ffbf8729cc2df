"""Plain ffcv on an ImageNet-like folder, as ffcv-imagenet's ``write_imagenet.py`` writes it (no betonbuild import).

    plain_imagenet.py ROOT OUT.beton WORKERS MAX_RESOLUTION [CHUNKSIZE]

``write_imagenet.py`` reads the folder with torchvision's ``ImageFolder`` (classes: the sorted folder
names, files sorted by name, each opened with PIL and ``.convert("RGB")``) and writes ``image``
``RGBImageField(write_mode, max_resolution, compress_probability, jpeg_quality)`` + ``label``
``IntField`` with ``DatasetWriter(num_workers)`` and ``from_indexed_dataset(chunksize=100)``. torchvision
is not installed here, so ``Folder`` is that ImageFolder's listing and loader (torch's import, which
ffcv pays anyway, included). Here: write_mode jpg, jpeg_quality 90. Prints the in-process seconds
(listing + write, imports excluded) as JSON.
"""

import json
import os
import sys
import time

from ffcv.fields import IntField, RGBImageField
from ffcv.writer import DatasetWriter
from PIL import Image

EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")  # torchvision's


class Folder:
    def __init__(self, root: str):
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.items = [
            (os.path.join(root, name, file), label)
            for label, name in enumerate(classes)
            for file in sorted(os.listdir(os.path.join(root, name)))
            if file.lower().endswith(EXTENSIONS)
        ]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        path, label = self.items[index]
        with open(path, "rb") as fh:  # torchvision's pil_loader
            return Image.open(fh).convert("RGB"), label


def main() -> None:
    root, out, workers, max_resolution = sys.argv[1:5]
    chunksize = int(sys.argv[5]) if len(sys.argv) > 5 else 100
    started = time.monotonic()
    dataset = Folder(root)
    image = RGBImageField(
        write_mode="jpg", max_resolution=int(max_resolution), compress_probability=0.5, jpeg_quality=90
    )
    writer = DatasetWriter(out, {"image": image, "label": IntField()}, num_workers=int(workers))
    writer.from_indexed_dataset(dataset, chunksize=chunksize)
    print(json.dumps({"seconds": round(time.monotonic() - started, 3), "samples": len(dataset)}))


if __name__ == "__main__":
    main()
