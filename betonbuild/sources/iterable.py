"""``iterable``: the user's ``module:factory(**args)`` returning an iterable (a generator, a torch
``IterableDataset``, anything with ``__iter__``) whose length may be unknown.

It cannot be indexed, so the stages see it two ways (docs/iterable-sources.md):

- ``IterableSource`` (``open``): its first ``smoke.samples`` samples, read by a short iteration of
  their own and held in memory, indexed 0..k-1. The source manifest, the smoke file, its gate and
  the determinism check read these (each stage iterates anew: k samples, cheap).
- ``iterate(spec, start)``: the whole stream from a position, for the one-pass write
  (``betonbuild.write.onepass``) and the verification's second iteration. A factory with a
  ``start`` or ``skip`` parameter is asked to start there; any other is read and the samples before
  ``start`` are handed back to the caller to be compared and dropped.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import itertools
import pickle
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from betonbuild.config.spec import DatasetSpec, FieldSpec
from betonbuild.errors import ConfigError, SampleError, SourceError
from betonbuild.sources.adapters import factory_properties, import_factory
from betonbuild.sources.base import Source

# The factory parameters, by name, through which it is asked to start at a sample position.
START_PARAMETERS = ("start", "skip")
# A one-pass source's parts, when the config gives no `samples_per_partition`.
DEFAULT_SAMPLES_PER_PART = 10_000
OBJECT_BYTES = 64  # a Python object's header and the reference to it


class IterableSource(Source):
    kind = "iterable"
    config_schema = {
        "additionalProperties": False,
        "required": ["factory"],
        "properties": {
            "kind": {},
            **factory_properties("an iterable of samples (called again for every iteration)"),
            "length": {
                "type": ["integer", "null"],
                "minimum": 1,
                "default": None,
                "description": "The number of samples the iterable yields, if known: the write stops with "
                "an error when it yields fewer or more.",
            },
        },
    }
    may_import_ffcv = True  # the user's code may import anything (ffcv, torch)
    one_pass = True
    files: list[str] = []  # the factory's module is an adapter file

    def __init__(self, spec: DatasetSpec):
        """The first ``spec.smoke_samples`` samples (fewer if the iterable is shorter), copied."""
        self.spec = spec
        stream = iterate(spec)
        self.samples = [sample for _, sample in itertools.islice(stream, spec.smoke_samples)]
        stream.close()
        if not self.samples:
            raise SourceError(spec.name, f"factory {spec.source['factory']} yielded no sample; a .beton needs one")

    # -- from the config alone --------------------------------------------------------------------

    @classmethod
    def check_config(
        cls, where: str, source: dict[str, Any], fields: tuple[FieldSpec, ...], writer: dict[str, Any]
    ) -> None:
        dataset = where.rsplit(".", 1)[0]
        why = "cannot apply to an iterable source, which is read once, in its own order"
        if writer.get("indices") is not None:
            raise ConfigError(
                f"{dataset}.writer.indices",
                f"{why}; select the samples in the factory (e.g. itertools.islice) or remove the key",
            )
        if writer.get("shuffle"):
            raise ConfigError(
                f"{dataset}.writer.shuffle",
                f"{why} (a shuffle needs random access); shuffle in the factory or set shuffle: false",
            )

    @classmethod
    def check_spec(cls, spec: DatasetSpec) -> None:
        if spec.partitions.count is not None:
            raise ConfigError(
                f"datasets.{spec.name}.partitions",
                "an iterable source's length is unknown before it is read, so it cannot be cut into a "
                "number of parts; give samples_per_partition instead",
            )
        policy = spec.bad_samples
        if policy.skip and 0 < policy.max < 1 and spec.source.get("length") is None:
            raise ConfigError(
                f"datasets.{spec.name}.bad_samples.max",
                f"is a fraction ({policy.max}) of the samples, but an iterable source's count is known only once "
                "it has been read to its end, so the write could not stop at the first bad sample beyond it; "
                "give a count (e.g. max: 100) or give source.length",
            )

    @classmethod
    def adapter_references(cls, spec: DatasetSpec) -> list[str]:
        return [spec.source["factory"]]

    @classmethod
    def estimated_length(cls, spec: DatasetSpec) -> int | None:
        return spec.source.get("length")

    @classmethod
    def samples_per_part(cls, spec: DatasetSpec) -> int:
        return spec.partitions.samples or DEFAULT_SAMPLES_PER_PART

    # -- an opened source (its first samples) -----------------------------------------------------

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Any:
        return self.samples[index]

    def inputs_fingerprint(self, read_files: bool = True) -> dict[str, Any]:
        return {"files": 0, "bytes": 0, "sha256": ""}  # the factory's module is an adapter file

    def part_fingerprint(self, rows: np.ndarray, inputs: dict[str, Any]) -> str:
        return chained_digest(sample_digest(self.samples[int(i)]) for i in rows)


def iterate(spec: DatasetSpec, start: int = 0) -> Iterator[tuple[int, Any]]:
    """``(position, sample)`` from position ``start`` (or from 0, see ``starts_itself``) to the end,
    each sample a copy (an iterator that refills one buffer yields distinct samples). An exception
    of the user's iterator becomes a SampleError naming the position it was producing."""
    factory = import_factory(spec.name, spec.source["factory"])
    args = dict(spec.source.get("args", {}))
    parameter = start_parameter(factory)
    if start and parameter:
        args[parameter] = start
    position = start if parameter else 0
    try:
        iterable = factory(**args)
        iterator = iter(iterable)
    except Exception as exc:
        raise SourceError(spec.name, f"factory {spec.source['factory']} raised {type(exc).__name__}: {exc}") from exc
    return _positions(spec, iterator, position)


def _positions(spec: DatasetSpec, iterator: Iterator, position: int) -> Iterator[tuple[int, Any]]:
    try:
        while True:
            try:
                sample = next(iterator)
            except StopIteration:
                return
            except Exception as exc:
                raise SampleError(
                    spec.name,
                    None,
                    position,
                    f"the iterable of factory {spec.source['factory']} raised {type(exc).__name__}: {exc} while "
                    f"producing sample {position} (position in the stream)",
                    "fix the iterable; the finished parts are kept and the next run resumes after them",
                ) from exc
            yield position, _copied(sample)
            position += 1
    finally:
        # a user's generator left early (the first samples only) closes its files and connections now
        close = getattr(iterator, "close", None)
        if callable(close):
            close()


def start_parameter(factory) -> str | None:
    """The name of the factory's ``start``/``skip`` parameter, if it has one."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return None
    return next((name for name in START_PARAMETERS if name in parameters), None)


def starts_itself(spec: DatasetSpec) -> bool:
    """Whether the factory is asked to start at a position (else the stream is read from 0)."""
    return start_parameter(import_factory(spec.name, spec.source["factory"])) is not None


def _copied(sample: Any) -> Any:
    try:
        return copy.deepcopy(sample)
    except Exception:  # noqa: BLE001 - an object that cannot be copied is written as it is
        return sample


def sample_digest(sample: Any) -> bytes:
    """32 bytes that change when any value of the raw sample does (arrays by dtype, shape and bytes)."""
    digest = hashlib.sha256()
    _feed(digest, sample)
    return digest.digest()


def _feed(digest, value: Any) -> None:
    if isinstance(value, np.ndarray) and value.dtype != object:
        digest.update(f"a{value.dtype.str}{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    elif hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        _feed(digest, value.detach().cpu().numpy())
    elif hasattr(value, "tobytes") and hasattr(value, "mode") and hasattr(value, "size"):  # a PIL image
        digest.update(f"i{value.mode}{value.size}".encode())
        digest.update(value.tobytes())
    elif isinstance(value, (tuple, list)):
        digest.update(f"l{len(value)}".encode())
        for item in value:
            _feed(digest, item)
    elif isinstance(value, dict):
        digest.update(f"d{len(value)}".encode())
        for key, item in value.items():
            _feed(digest, key)
            _feed(digest, item)
    else:
        try:
            digest.update(pickle.dumps(value, protocol=5))
        except Exception:  # noqa: BLE001 - an unpicklable object: only its type is known
            digest.update(f"?{type(value).__qualname__}".encode())


def held_bytes(value: Any) -> int:
    """About how much memory a yielded sample holds once the writer has it decoded: arrays, buffers
    and strings by their bytes, a PIL image by its pixels, anything else by ``sys.getsizeof``; a
    container adds its items. The write holds a part's samples at once (``write.onepass``)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes) + OBJECT_BYTES
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        return len(value) + OBJECT_BYTES
    if hasattr(value, "detach") and hasattr(value, "element_size"):  # a torch tensor
        return int(value.numel() * value.element_size()) + OBJECT_BYTES
    if hasattr(value, "getbands") and hasattr(value, "size"):  # a PIL image, decoded when written
        width, height = value.size
        return width * height * len(value.getbands()) + OBJECT_BYTES
    if isinstance(value, (tuple, list)):
        return sum(held_bytes(item) for item in value) + OBJECT_BYTES
    if isinstance(value, dict):
        return sum(held_bytes(k) + held_bytes(v) for k, v in value.items()) + OBJECT_BYTES
    return sys.getsizeof(value)


def chained_digest(digests) -> str:
    """One hex digest of the samples' digests, in order."""
    chained = hashlib.sha256()
    for d in digests:
        chained.update(d)
    return chained.hexdigest()
