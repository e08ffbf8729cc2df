"""The JPEG encode limit: ``cv2.imencode`` alone (q90, RGB->BGR first, as ffcv does) on WORKERS processes.

    imencode.py IMAGES.npy WORKERS

No container, no file, no bookkeeping: the machine's ceiling for writing these images as JPEG.
Prints the in-process encode time and the total JPEG bytes as JSON.
"""

import json
import sys
import time
from multiprocessing import Pool

import cv2
import numpy as np

PARAMS = [int(cv2.IMWRITE_JPEG_QUALITY), 90]


def encode(job):
    path, start, stop = job
    images = np.load(path, mmap_mode="r")
    total = 0
    for k in range(start, stop):
        ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(images[k], cv2.COLOR_RGB2BGR), PARAMS)
        assert ok
        total += jpeg.size
    return total


def main() -> None:
    path, workers = sys.argv[1], int(sys.argv[2])
    n = len(np.load(path, mmap_mode="r"))
    chunk = 100
    jobs = [(path, start, min(n, start + chunk)) for start in range(0, n, chunk)]
    started = time.monotonic()
    with Pool(workers) as pool:
        total = sum(pool.imap_unordered(encode, jobs))
    print(json.dumps({"seconds": round(time.monotonic() - started, 3), "jpeg_bytes": total, "images": n}))


if __name__ == "__main__":
    main()
