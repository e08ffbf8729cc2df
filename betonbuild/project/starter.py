"""``betonbuild init DIR``: a starter project a newcomer edits instead of reading the reference first.

It writes ``config.yaml`` (one working dataset from the example adapter, and every source kind as a
commented example), ``mydatasets.py`` (the adapter), and a README of the three commands. With
``--from PATH`` the working dataset is guessed from PATH instead (``betonbuild.project.guess``).
"""

from __future__ import annotations

from pathlib import Path

from betonbuild.atomic import atomic_path
from betonbuild.errors import BetonbuildError

HEADER = """\
# betonbuild project config: one entry per dataset under `datasets:`; each becomes
# results/NAME/NAME.beton plus results/NAME/NAME.verify.json (the read-back report).
# Paths are relative to this directory. Every key, its default and its constraints: betonbuild's
# docs/configuration.md; `betonbuild schema` prints them all (JSON Schema).

datasets:
"""

EXAMPLE_DATASET = """\
  # The example adapter in mydatasets.py: any object with __len__ and __getitem__ works.
  squares:
    source:
      kind: python
      factory: "mydatasets:squares"
      args: {n: 64}
    fields:
      image: {type: ndarray, dtype: uint8, shape: [8, 8]}
      label: {type: int}
      side: {type: float}
"""

# Every source kind, commented out: uncomment one, point it at your files, remove what you do not need.
EXAMPLES = """\
  # --- More examples: uncomment one and point it at your data. ------------------------------
  #
  # NumPy arrays: one .npz (`columns` maps each field to a key inside it), or one .npy per field
  # (`columns` maps each field to a path; no `path`).
  # my_arrays:
  #   source:
  #     kind: arrays
  #     path: data/train.npz
  #     columns: {image: x, label: y}
  #   fields:
  #     image: {type: ndarray, dtype: uint8, shape: [28, 28]}
  #     label: {type: int}
  #
  # An image folder root/<class>/<image>; the label is the class folder's position in sorted order.
  # my_images:
  #   source:
  #     kind: image_folder
  #     root: data/images
  #   fields:
  #     image: {type: rgb_image, write_mode: jpg, max_resolution: 256, image_mode: convert}
  #     label: {type: int}
  #
  # Local WebDataset shards (brace pattern, glob or list); `keys` maps fields to member extensions.
  # my_shards:
  #   source:
  #     kind: webdataset
  #     shards: data/shards/train-{0000..0015}.tar
  #     keys: {image: "jpg;png", label: cls}
  #   fields:
  #     image: {type: rgb_image, write_mode: jpg}
  #     label: {type: int}
  #
  # Your own Python dataset: module:function(**args), imported from this directory.
  # my_python:
  #   source:
  #     kind: python
  #     factory: "mydatasets:squares"
  #     args: {n: 1000}
  #   fields:
  #     image: {type: ndarray, dtype: uint8, shape: [8, 8]}
  #     label: {type: int}
  #     side: {type: float}
  #
  # Parquet files and Hugging Face `save_to_disk` directories (the kinds `parquet` and
  # `huggingface`, where your betonbuild has them: `betonbuild schema` lists the kinds):
  # my_table:
  #   source:
  #     kind: parquet
  #     path: data/train.parquet
  #   fields:
  #     label: {type: int}
  # my_hf:
  #   source:
  #     kind: huggingface
  #     path: data/hf_train
  #   fields:
  #     label: {type: int}
  #
  # Field types: int, float, ndarray, torch_tensor, rgb_image, bytes, json, custom.
"""

ADAPTER = '''\
"""An example adapter: `factory: "mydatasets:squares"` in config.yaml calls squares(**args).

betonbuild needs an object with __len__ and __getitem__(int). A sample is a tuple in field order,
or a dict keyed by field name. It must return the same values for the same index every time
(seed any randomness with the index): the smoke stage reads samples twice and checks.
"""

import numpy as np


class Squares:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        side = 1 + i % 8
        image = np.zeros((8, 8), dtype=np.uint8)
        image[:side, :side] = 255
        return {"image": image, "label": side - 1, "side": float(side)}


def squares(n=64):
    return Squares(n)
'''

README = """\
# {name}: a betonbuild project

```bash
pip install betonbuild     # once; ffcv builds from source: apt-get install libopencv-dev libturbojpeg0-dev pkg-config
betonbuild run --cores 4   # builds and verifies every dataset in config.yaml
betonbuild status          # which datasets are up to date, and why the others would rebuild
```

- Edit `config.yaml`: one entry per dataset (examples of every source kind are in it, commented).
- Outputs: `results/NAME/NAME.beton` and `results/NAME/NAME.verify.json` (`"ok": true` when every
  check passed); logs in `logs/`.
- `betonbuild run -n` shows what would run; `betonbuild run --report report.html` collects the
  previews and reports into one page; `betonbuild run --profile slurm` runs the jobs on SLURM.
  Every other option is Snakemake's.
"""


def write_project(directory: Path, dataset_entry: str | None = None) -> list[Path]:
    """The starter files in ``directory`` (created if needed); refuses to overwrite any of them."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "config.yaml": HEADER + (dataset_entry or EXAMPLE_DATASET) + "\n" + EXAMPLES,
        "mydatasets.py": ADAPTER,
        "README.md": README.format(name=directory.resolve().name),
    }
    existing = [name for name in files if (directory / name).exists()]
    if existing:
        raise BetonbuildError(
            f"{directory} already has {', '.join(existing)}; betonbuild init does not overwrite files: "
            "choose a new directory or move them away"
        )
    written = []
    for name, text in files.items():
        with atomic_path(directory / name) as tmp:
            tmp.write_text(text)
        written.append(directory / name)
    return written
