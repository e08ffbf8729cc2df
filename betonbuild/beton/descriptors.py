"""The start of a .beton as a writer lays it down: the header record and one descriptor per field
(type id, name, the field's ``to_binary()`` arguments), as ffcv 1.0.2's ``DatasetWriter.prepare``
writes them.

A field's type id is ffcv's ``TYPE_ID_HANDLER`` entry for its exact class (a subclass is a custom
field: 255), or, for betonbuild's encoders of ffcv's built-in fields, their ``betonbuild_type_id``:
the id of the ffcv class whose bytes they write.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from betonbuild.beton.format import CUSTOM_TYPE_ID, FIELD_DESC_TYPE, FORMAT_VERSION, HEADER_TYPE

NAME_BYTES = FIELD_DESC_TYPE["name"].shape[0]


def type_id_of(field: Any) -> int:
    """The descriptor type id ffcv's Reader will look the field's class up by."""
    own = getattr(type(field), "betonbuild_type_id", None)
    if own is not None:
        return own
    ffcv_types = sys.modules.get("ffcv.types")  # loaded with any ffcv class: never imported here
    if ffcv_types is not None:
        for type_id, handler in ffcv_types.TYPE_ID_HANDLER.items():
            if handler is not None and type(field) is handler:
                return type_id
    return CUSTOM_TYPE_ID


def field_descriptors(fields: Mapping[str, Any]) -> np.ndarray:
    """One ``FIELD_DESC_TYPE`` record per field, in order; ValueError for a name ffcv would cut."""
    descriptors = np.zeros(len(fields), dtype=FIELD_DESC_TYPE)
    for i, (name, field) in enumerate(fields.items()):
        encoded = name.encode("ascii")
        if len(encoded) > NAME_BYTES:
            raise ValueError(f"field name {name!r} is longer than ffcv's {NAME_BYTES} bytes")
        descriptors[i]["type_id"] = type_id_of(field)
        descriptors[i]["name"][: len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
        descriptors[i]["arguments"][:] = field.to_binary()[0]
    return descriptors


def header_record(num_fields: int, page_size: int, num_samples: int, alloc_table_ptr: int = 0) -> np.void:
    """The header; a writer writes it again at the end, once ``alloc_table_ptr`` is known."""
    header = np.zeros(1, dtype=HEADER_TYPE)[0]
    header["version"] = FORMAT_VERSION
    header["num_samples"] = num_samples
    header["num_fields"] = num_fields
    header["page_size"] = page_size
    header["alloc_table_ptr"] = alloc_table_ptr
    return header


def metadata_type(fields: Mapping[str, Any]) -> np.dtype:
    """The record of one sample: the fields' records, aligned (ffcv's ``get_metadata_type``)."""
    return np.dtype([("", field.metadata_type) for field in fields.values()], align=True)
