"""Error types whose messages a user can act on. Raised where the fact is known, printed once at the edge."""


class BetonbuildError(Exception):
    """Base class: everything betonbuild raises on purpose."""


class ConfigError(BetonbuildError):
    """The configuration is wrong; ``where`` is a dotted path such as ``datasets.photos.fields``."""

    def __init__(self, where: str, why: str):
        self.where = where
        self.why = why
        super().__init__(f"{where}: {why}")

    def __reduce__(self):
        return (type(self), (self.where, self.why))


class SourceError(BetonbuildError):
    """The dataset's source cannot be opened or read (missing file, factory import error...)."""

    def __init__(self, dataset: str, why: str):
        self.dataset = dataset
        self.why = why
        super().__init__(f"dataset '{dataset}': {why}")

    def __reduce__(self):  # e.g. raised in a writer worker process
        return (type(self), (self.dataset, self.why))


class SampleError(BetonbuildError):
    """One value of one sample breaks the field's contract. Names dataset, field and source index."""

    # False where the sample is not bad but the source changed under the build (a file edited since
    # it was listed, a shard with another count): ``bad_samples: skip`` must not leave it out.
    skippable = True

    def __init__(
        self, dataset: str, field: str | None, index: int | None, why: str, fix: str = "", location: str | None = None
    ):
        self.dataset = dataset
        self.field = field
        self.index = index
        self.why = why
        self.fix = fix
        self.location = location  # e.g. "shard data/wds/train-0003.tar, key 000123"
        where = f"dataset '{dataset}'"
        if field is not None:
            where += f", field '{field}'"
        if index is not None:
            where += f", sample index {index}"
        if location:
            where += f" ({location})"
        message = f"{where}: {why}"
        if fix:
            message += f". Fix: {fix}"
        super().__init__(message)

    def __reduce__(self):
        # Keeps the structured fields when the error crosses a process boundary.
        return (type(self), (self.dataset, self.field, self.index, self.why, self.fix, self.location))


class WriteError(BetonbuildError):
    """The write failed for a reason that is not one sample's fault (worker died, disk full...)."""


class BetonFormatError(BetonbuildError):
    """A .beton file is malformed: truncated, corrupt or not a .beton at all."""


class VerificationError(BetonbuildError):
    """The read-back report found the file does not match its source."""


class MergeError(BetonbuildError):
    """Part files cannot be merged into one .beton; the message names the part and what differs."""
