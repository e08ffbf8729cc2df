"""One batch through the real ``ffcv.Loader``, compared with what the memmap reader decoded; run in a
child process (``LoaderProcess``) where the comparisons need nothing of ffcv, so that importing
ffcv (torch) and numba's compilation happen on another core, and this process never imports them.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from betonbuild._compat.ffcv_epoch_errors import install as raise_loader_thread_errors
from betonbuild._compat.ffcv_loader_memory import lean_os_cache
from betonbuild._compat.ffcv_numba_cache import cache_compiled_code
from betonbuild._compat.numba_blas_check import skip_blas_check
from betonbuild.beton.format import BetonFile
from betonbuild.config.load import spec_from_dict
from betonbuild.config.spec import DatasetSpec
from betonbuild.fields import field_kind
from betonbuild.fields.custom import custom_handlers
from betonbuild.fields.kind import OWN_DECODER
from betonbuild.loader_process import LoaderProcess
from betonbuild.sources import source_class


def content_without_ffcv(spec: DatasetSpec) -> bool:
    """Whether comparing the samples needs neither ffcv's nor torch's modules, so that the Loader batch
    can run in a child process (``start_loader_process``) and this one import neither. Custom field
    classes are ffcv Fields, torch_tensor values need torch, ``max_resolution`` needs ffcv's resizer
    (``FieldKind.compare_needs_ffcv``); a ``python`` source may import anything. (Reading shards
    imports webdataset, and so torch, but not ffcv: the Loader's import and numba compile still move
    to the other core.)"""
    if source_class(spec).may_import_ffcv:
        return False
    return not any(field_kind(f).compare_needs_ffcv(f) for f in spec.fields)


def import_ffcv() -> None:
    """ffcv's modules import each other in cycles: importing them from two threads at once fails
    ("partially initialized module"), so the main thread imports all of them before the pool starts."""
    import ffcv.fields.basics  # noqa: F401
    import ffcv.fields.bytes  # noqa: F401
    import ffcv.fields.decoders  # noqa: F401
    import ffcv.fields.json  # noqa: F401
    import ffcv.fields.ndarray  # noqa: F401
    import ffcv.fields.rgb_image  # noqa: F401
    import ffcv.libffcv  # noqa: F401
    import ffcv.loader  # noqa: F401


def start_loader_process(
    spec: DatasetSpec, threads: int = 2, started: LoaderProcess | None = None
) -> LoaderProcess | None:
    """The child process that will run the Loader batch of ``spec``'s file, started now: it imports
    ffcv meanwhile, then waits for ``request``. None where the comparisons need ffcv's modules
    anyway (``content_without_ffcv``: the batch then runs on a thread), for a job of one thread
    (a second process would use a core Snakemake did not give it: the parts' verifications run
    side by side), or where no process can start. Nor where this process imported ffcv already (a
    gate whose comparisons needed it): the batch then costs no import, only its run.

    ``started``: the child a job script started before it imported betonbuild's modules
    (``betonbuild.loader_process``): used where a child is wanted, ended where not."""
    if "ffcv.loader" not in sys.modules and threads > 1 and content_without_ffcv(spec):
        return started or LoaderProcess.start()
    if started is not None:
        started.close()
    return None


def loader_child() -> None:
    """The child process of ``LoaderProcess``: imports ffcv at once, then answers each {path, spec}
    line on stdin with an {ok, detail} line, until stdin ends (at once if no file is needed). Its
    fields' decoders are ffcv's and betonbuild's, none of which calls BLAS: numba's check for one
    is skipped."""
    skip_blas_check()
    try:
        import_ffcv()
        failure = None
    except Exception as exc:  # noqa: BLE001 - reported as the check's failure below
        failure = f"importing ffcv failed: {type(exc).__name__}: {exc}"
    for line in iter(sys.stdin.buffer.readline, b""):
        try:
            if failure:
                raise RuntimeError(failure)
            request = json.loads(line)
            spec = spec_from_dict(request["spec"])
            beton = BetonFile(request["path"], custom_handlers=custom_handlers(spec))
            ok, detail = check_loader_batch(beton, spec)
        except Exception as exc:  # noqa: BLE001 - as Report.run: a check that crashes is a failed check
            ok, detail = False, failure or f"{type(exc).__name__}: {exc}"
        sys.stdout.write("\n" + json.dumps({"ok": bool(ok), "detail": detail}) + "\n")
        sys.stdout.flush()
    os._exit(0)  # skips the interpreter's teardown of torch and numba (~0.1 s): nothing is left to do


def check_loader_batch(beton: BetonFile, spec: DatasetSpec) -> tuple[bool, str]:
    """One batch through the real ffcv.Loader, compared with what the memmap reader decoded."""
    from ffcv.loader import Loader, OrderOption
    from ffcv.pipeline import PipelineSpec

    raise_loader_thread_errors()  # a failing batch thread raises here instead of hanging the check
    cache_compiled_code()  # the reader and decoders compiled by an earlier Loader process are reused
    n = min(spec.verify["loader_batch"], beton.num_samples)
    pipelines, skipped = {}, []
    for field in spec.fields:
        pipeline = field_kind(field).loader_pipeline(field, beton, n)
        if pipeline is OWN_DECODER:
            continue  # the class's own decoder (get_decoder_class), registered below
        pipelines[field.name] = pipeline
        if pipeline is None:
            skipped.append(field.name)
    extras = {}  # the shapes / lengths outputs of betonbuild's own kinds (betonbuild.loader_pipelines)
    for field in spec.fields:
        if pipelines.get(field.name, True) is not None:
            extras.update({out: (field, dec) for out, dec in field_kind(field).loader_extra_outputs(field).items()})
    pipelines.update({out: PipelineSpec(field.name, decoder=dec) for out, (field, dec) in extras.items()})
    with lean_os_cache(n):  # ffcv's per-sample page maps skipped: ~600 bytes a sample, never read here
        loader = Loader(
            beton.path,
            batch_size=n,
            num_workers=1,
            order=OrderOption.SEQUENTIAL,
            indices=list(range(n)),
            pipelines=pipelines,
            drop_last=False,
            os_cache=True,
            custom_fields=custom_handlers(spec),
        )
    batch = next(iter(loader))
    batch = [b.numpy() if hasattr(b, "numpy") else np.asarray(b) for b in batch]
    names = [f.name for f in spec.fields if pipelines.get(f.name, True) is not None] + list(extras)
    loaded = dict(zip(names, batch))
    problems, unchecked = [], []
    for field in spec.fields:
        if field.name not in loaded:
            continue
        kind, items = field_kind(field), loaded[field.name]
        if not kind.loader_comparable(field):
            unchecked.append(field.name)
            continue
        for position in range(n):
            if not kind.loader_equal(field, beton, items[position], position):
                problems.append(f"field '{field.name}' sample {position}: ffcv.Loader and the file disagree")
                break
    for output, (field, _) in extras.items():
        items = np.asarray(loaded[output])
        if not all(field_kind(field).loader_extra_equal(field, beton, items[p], p) for p in range(n)):
            problems.append(f"field '{field.name}': ffcv.Loader's {output} disagrees with the file's records")
    detail = "; ".join(problems) or f"ffcv.Loader read {n} samples, equal to the file's decoded content"
    if extras and not problems:
        detail += f", and their shapes and lengths {list(extras)}"
    if skipped:
        detail += f" (fields {skipped} skipped: images of several sizes)"
    if unchecked:
        detail += f" (custom fields {unchecked} loaded; their classes have no decode/from_loader to compare)"
    return not problems, detail
