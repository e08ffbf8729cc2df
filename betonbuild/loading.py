"""What training code passes to ffcv to read a .beton holding betonbuild's own field kinds.

``ragged_ndarray``, ``int_list``, ``text`` and ``gray_image`` are ffcv custom fields (type id 255):
plain ffcv raises "Must specify a custom_field entry" for them until their classes are registered.
The file names the class of each (``betonbuild.fields.shipped.MAGIC``), so one call finds them::

    from ffcv.loader import Loader
    import betonbuild

    loader = Loader(path, batch_size=256, custom_fields=betonbuild.loader_fields(path),
                    pipelines=betonbuild.loader_pipelines(path))
    # ffcv.reader.Reader(path, custom_handlers=betonbuild.loader_fields(path)) takes the same mapping

``loader_pipelines`` adds the outputs that make the padded batches exact, after the file's fields:
``<name>_shape`` (ragged_ndarray, gray_image: height and width), ``<name>_len`` (int_list, text,
and ffcv's own ``bytes`` fields, whose BytesDecoder pads every item to the batch's largest).
``unpad`` and ``texts`` turn a batch back into the samples. ``loader_pipelines`` also makes an error
in ffcv's batch thread raise in the loop (``betonbuild._compat.ffcv_epoch_errors``) instead of hanging it.
"""

from __future__ import annotations

import os

import numpy as np

from betonbuild.beton.format import BYTES_TYPE_ID, CUSTOM_TYPE_ID, FIELD_DESC_TYPE, HEADER_TYPE
from betonbuild.errors import BetonFormatError
from betonbuild.fields.gray_field import GrayImageField
from betonbuild.fields.ragged_field import IntListField, RaggedArrayField, TextField
from betonbuild.fields.shipped import shipped_kind_name

CLASSES: dict[str, type] = {
    cls.betonbuild_kind: cls for cls in (RaggedArrayField, IntListField, TextField, GrayImageField)
}


def _descriptors(path: str | os.PathLike) -> list[tuple[str, int, np.ndarray]]:
    """(name, type id, argument bytes) of every field of the file, from its header alone."""
    with open(path, "rb") as fh:
        header = np.frombuffer(fh.read(HEADER_TYPE.itemsize), dtype=HEADER_TYPE)
        if len(header) != 1:
            raise BetonFormatError(f"{path}: too small for a .beton header")
        count = int(header[0]["num_fields"])
        descs = np.frombuffer(fh.read(FIELD_DESC_TYPE.itemsize * count), dtype=FIELD_DESC_TYPE)
    if len(descs) != count:
        raise BetonFormatError(f"{path}: {count} field descriptors do not fit in the file")
    return [
        (bytes(d["name"]).partition(b"\0")[0].decode("ascii", errors="replace"), int(d["type_id"]), d["arguments"])
        for d in descs
    ]


def loader_fields(path: str | os.PathLike) -> dict[str, type]:
    """{field name: class} of the file's betonbuild fields: ``Loader(custom_fields=...)`` and
    ``Reader(custom_handlers=...)``. Other custom fields (``type: custom``) are left to their own classes."""
    found = {}
    for name, type_id, arguments in _descriptors(path):
        kind = shipped_kind_name(arguments) if type_id == CUSTOM_TYPE_ID else None
        if kind in CLASSES:
            found[name] = CLASSES[kind]
    return found


def shipped_handlers(path: str | os.PathLike) -> dict[str, type]:
    """``loader_fields``, or {} for a file it cannot read (the reader then says what is wrong with it)."""
    try:
        return loader_fields(path)
    except (OSError, BetonFormatError, ValueError):
        return {}


def loader_pipelines(path: str | os.PathLike) -> dict:
    """``Loader(pipelines=...)`` entries adding each variable field's shapes or lengths as an output
    of its own (``<name>_shape`` / ``<name>_len``); the fields themselves keep their default pipelines."""
    from ffcv.pipeline import PipelineSpec  # why local: ffcv imports torch
    from ffcv.transforms import ToTensor

    from betonbuild._compat.ffcv_epoch_errors import install  # why local: it imports ffcv's loader
    from betonbuild.fields import decoders  # why local: it imports ffcv

    install()  # an error in the Loader's batch thread is raised in the training loop, not a hang
    handlers = loader_fields(path)
    pipelines = {}
    for name, type_id, arguments in _descriptors(path):
        if name in handlers:
            outputs = handlers[name].from_binary(np.array(arguments)).extra_outputs(name)
        elif type_id == BYTES_TYPE_ID:
            outputs = {f"{name}_len": decoders.length_decoder()()}
        else:
            continue
        for output, decoder in outputs.items():
            pipelines[output] = PipelineSpec(name, decoder=decoder, transforms=[ToTensor()])
    return pipelines


def unpad(batch, shapes) -> list[np.ndarray]:
    """The samples of a padded batch: row i cut to ``shapes[i]`` (a ``<name>_shape`` or ``<name>_len`` output)."""
    batch, shapes = np.asarray(batch), np.asarray(shapes)
    shapes = shapes.reshape(len(shapes), -1)
    return [batch[i][tuple(slice(0, int(s)) for s in shapes[i])] for i in range(len(shapes))]


def texts(batch, lengths) -> list[str]:
    """The strings of a ``text`` batch (padded UTF-8 bytes) and its ``<name>_len`` output."""
    return [row.tobytes().decode("utf-8") for row in unpad(np.asarray(batch, dtype=np.uint8), lengths)]
