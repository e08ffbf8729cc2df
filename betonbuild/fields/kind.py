"""What betonbuild knows about one kind of field (a config ``type``), in one object.

Each kind module of this package (``int``, ``rgb_image``, ``custom``...) defines one subclass of
``FieldKind`` and one instance, ``KIND``; ``betonbuild.fields.FIELD_KINDS`` collects them. Every
other module asks the kind instead of branching on ``field.type``: the config options, the ffcv
field it builds, its type id and metadata dtype (taken from the file format's own table,
``betonbuild.beton.format``), the sample check, how verification compares it, its content-digest
bytes, its preview and its per-sample resource numbers. The defaults below are those of a
variable-size built-in field with one allocation per sample.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from betonbuild.beton.format import METADATA_TYPES, TYPE_NAMES, BetonFile, FieldInfo
from betonbuild.beton.payloads import decode_image
from betonbuild.config.spec import FieldSpec
from betonbuild.errors import SampleError

# ``loader_pipeline`` returns this when ffcv's Loader must use the field class's own decoder
# (``get_decoder_class``): the field is then left out of the Loader's ``pipelines``.
OWN_DECODER = "own decoder"

Fail = Callable[..., SampleError]  # fail(why, fix="") -> the SampleError naming dataset, field and index


def describe(value: Any) -> str:
    """A short summary of a value for error messages: type, dtype, shape, or a clipped repr."""
    if isinstance(value, np.ndarray):
        return f"numpy array dtype={value.dtype} shape={value.shape}"
    if type(value).__module__ == "torch" and hasattr(value, "shape"):
        return f"torch tensor dtype={value.dtype} shape={tuple(value.shape)} device={value.device}"
    if type(value).__module__.startswith("PIL."):
        return f"PIL image mode={value.mode} size={value.size}"
    return f"{type(value).__name__} {clipped(repr(value), 60)}"


def clipped(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, the last three "..." when it was longer."""
    return text if len(text) <= width else text[: width - 3] + "..."


class StoredSample(Protocol):
    """What verification gives a kind's ``compare`` of one sample of the file (``betonbuild.verify``)."""

    beton: BetonFile
    position: int  # the sample's position in the file
    tolerance: float  # the JPEG mean absolute pixel error a comparison accepts

    def image(self, name: str) -> tuple[np.ndarray, bool]:
        """Field ``name``'s stored image decoded as ffcv's Loader decodes it, and whether it is stored raw."""

    def allocations(self) -> list[tuple[int, int]]:
        """(ptr, size) of the sample's custom allocations not claimed yet by an earlier field."""

    def claim(self, count: int) -> None:
        """Marks the next ``count`` custom allocations as the current field's."""


class FieldKind:
    name: str = ""  # the config's ``type``
    # The field's entry in the config, as JSON Schema (``betonbuild.config.load.schema`` assembles the
    # whole schema from the kinds'); the default: a kind without options
    options_schema: dict[str, Any] = {"additionalProperties": False, "properties": {"type": {}}}
    fixed_size: bool = False  # one value of known size per sample: compared vectorised for every sample
    cost_per_sample_s: float = 0.0  # reading, checking and encoding one value, one core
    verify_check: str = "variable_fields"  # the report check that compares the field's values
    preview_roles: tuple[str, ...] = ()  # "image" (contact sheet), "caption", "histogram", "values" (plots)
    custom_allocations: bool = False  # its allocations are found through the allocation table, not a pointer
    class_decodes_arguments: bool = False  # only the field's own class can read its descriptor's arguments

    # --- the file format ---------------------------------------------------------------------------

    @property
    def type_id(self) -> int:
        """ffcv's descriptor type id (``betonbuild.beton.format.TYPE_NAMES``)."""
        return next(type_id for type_id, name in TYPE_NAMES.items() if name == self.name)

    def metadata_type(self, field: FieldSpec) -> np.dtype:
        """The field's metadata record type in the .beton."""
        return METADATA_TYPES[self.type_id]

    def sample_dtype(self, field: FieldSpec) -> np.dtype | None:
        """The numpy dtype a fixed-size array field's values must have (None: not an array field)."""
        return None

    # --- config and writing ------------------------------------------------------------------------

    def normalise(self, where: str, options: dict[str, Any]) -> dict[str, Any]:
        """The field's config options (schema defaults filled) checked and in canonical form; ConfigError if wrong."""
        return options

    def build(self, field: FieldSpec) -> Any:
        """The object that writes it: ffcv's Field interface (``metadata_type``, ``to_binary``, ``encode``), and a
        ``betonbuild_type_id`` where the class writes as one of ffcv's (``betonbuild.fields.builtin_encoders``)."""
        raise NotImplementedError(self.name)

    def check(self, field: FieldSpec, value: Any, fail: Fail) -> Any:
        """The value ffcv will encode, or ``raise fail(why, fix)``: the sample contract."""
        raise NotImplementedError(self.name)

    def adapter_references(self, field: FieldSpec) -> list[str]:
        """``module:attr`` references to the user's code the field is written with (editing it rebuilds)."""
        return []

    def allow_empty(self, field: FieldSpec) -> bool:
        """Whether a size-0 allocation is this field's value, not a defect (the structural checks)."""
        return False

    # --- resources -----------------------------------------------------------------------------------

    def fixed_bytes(self, field: FieldSpec) -> int:
        """Payload bytes of one value of a fixed-size field (0 for variable-size fields)."""
        return 0

    def decoded_bytes(self, field: FieldSpec, page_size: int) -> int:
        """Upper bound of one decoded value: a variable-size value fits one page (ffcv's rule)."""
        return self.fixed_bytes(field) if self.fixed_size else page_size

    # --- verification --------------------------------------------------------------------------------

    def descriptor_problem(self, field: FieldSpec, info: FieldInfo) -> str | None:
        """Why the file's descriptor of the field disagrees with the config, or None."""
        return None

    def compare_needs_ffcv(self, field: FieldSpec) -> bool:
        """Whether comparing its values imports ffcv or torch (the Loader batch then runs on a thread)."""
        return False

    def stored_column(self, beton: BetonFile, field: FieldSpec, positions: np.ndarray) -> np.ndarray:
        """Fixed-size fields: the stored values at ``positions``, one row each."""
        raise NotImplementedError(self.name)

    def expected_column(self, values: list, found: np.ndarray) -> np.ndarray:
        """Fixed-size fields: the source values gathered one by one, as an array comparable with ``found``."""
        raise NotImplementedError(self.name)

    def compare(self, field: FieldSpec, stored: StoredSample, value: Any, stats: dict) -> str | None:
        """Variable-size fields: why the stored value differs from the checked source value, or None.
        ``stats`` (``compared``, ``mismatches`` and the kind's own counters) goes into the report."""
        raise NotImplementedError(self.name)

    def report_stats(self, field: FieldSpec, column: int, stats: dict, tolerance: float) -> None:
        """Adds the kind's notes to the field's report entry (``column``: the field's position)."""

    def loader_pipeline(self, field: FieldSpec, beton: BetonFile, n: int) -> list | str | None:
        """The decoders ffcv's Loader reads the first ``n`` samples with; None: skipped; ``OWN_DECODER``."""
        raise NotImplementedError(self.name)

    def loader_extra_outputs(self, field: FieldSpec) -> dict:
        """Loader outputs besides the field's own, {output name: decoder} (the shapes of betonbuild's kinds)."""
        return {}

    def loader_extra_equal(self, field: FieldSpec, beton: BetonFile, item: Any, position: int) -> bool:
        """Whether an extra output's item (each sample's shape or length) matches the file's record."""
        return True

    def loader_comparable(self, field: FieldSpec) -> bool:
        """Whether a Loader item can be compared with the file's decoded value."""
        return True

    def loader_equal(self, field: FieldSpec, beton: BetonFile, item: Any, position: int) -> bool:
        """Whether the Loader's item of the sample at ``position`` equals what the file holds."""
        raise NotImplementedError(self.name)

    # --- the report's preview (``betonbuild.report``) --------------------------------------------

    histogram_title = "histogram"

    def histogram_values(self, beton: BetonFile, field: FieldSpec) -> np.ndarray:
        """``preview_roles`` "histogram": the numbers plotted (by default the stored values)."""
        return np.asarray(beton.metadata[field.name])

    def preview_image(self, beton: BetonFile, field: FieldSpec, position: int) -> np.ndarray:
        """``preview_roles`` "image": the stored image at ``position`` (HxWx3 or HxW uint8)."""
        return decode_image(beton, field.name, position)

    # --- inspect (``betonbuild.beton.describe``) ---------------------------------------------------

    def describe_arguments(self, info: FieldInfo) -> dict[str, Any]:
        """The descriptor's arguments, decoded where the kind defines them (``inspect``, the verify report)."""
        return {}

    def data_bytes(self, beton: BetonFile, info: FieldInfo) -> int:
        """Bytes the field's values take in the data pages (custom allocations are counted apart)."""
        return 0

    def describe_stored(self, beton: BetonFile, info: FieldInfo) -> dict[str, Any]:
        """Entries the kind adds to the field's description, after its byte counts."""
        return {}

    def arguments_text(self, entry: dict[str, Any]) -> str:
        """The ``arguments`` column of ``betonbuild inspect``'s text, from the field's description entry."""
        return ", ".join(f"{k}={v}" for k, v in entry["arguments"].items() if k != "note")

    def summarise(self, beton: BetonFile, info: FieldInfo, position: int) -> Any:
        """A short, JSON-able summary of the value stored at ``position``; BetonFormatError if unreadable.
        By default its raw metadata record."""
        raw = beton.record_bytes(info.name, position)
        return f"record {raw[:16].hex(' ')}{' ...' if len(raw) > 16 else ''}"

    # --- content digest ------------------------------------------------------------------------------

    def digest_column(self, beton: BetonFile, info: FieldInfo, positions: np.ndarray, meta: np.ndarray):
        """The canonical bytes of the field in samples ``positions`` (``betonbuild.beton.digest``): an (n, k)
        uint8 array, or a function (i, position, allocations) -> the parts of sample i."""
        raise NotImplementedError(self.name)
