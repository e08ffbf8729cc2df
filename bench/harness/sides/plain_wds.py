"""Side A of the WebDataset benchmark: plain ffcv ``DatasetWriter.from_webdataset`` (no betonbuild).

    plain_wds.py 'train-{0000..0015}.tar' OUT.beton WORKERS

Decodes with webdataset's ``rgb8`` (PIL) and writes ``image`` RGBImageField(jpg, q90) + ``label``
IntField: what ffcv's documentation shows. ffcv decodes every sample twice (a counting pass first).
"""

import json
import sys
import time

from braceexpand import braceexpand
from ffcv.fields import IntField, RGBImageField
from ffcv.writer import DatasetWriter


def pipeline(dataset):
    return dataset.decode("rgb8").to_tuple("jpg", "cls")


def main() -> None:
    pattern, out, workers = sys.argv[1:4]
    fields = {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()}
    started = time.monotonic()
    DatasetWriter(out, fields, num_workers=int(workers)).from_webdataset(list(braceexpand(pattern)), pipeline)
    print(json.dumps({"seconds": round(time.monotonic() - started, 3)}))


if __name__ == "__main__":
    main()
