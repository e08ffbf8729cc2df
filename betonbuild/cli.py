"""``betonbuild init|run|status``: a project of your own; ``inspect|repro|write|verify``: troubleshooting by hand."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

from betonbuild.atomic import atomic_path
from betonbuild.errors import BetonbuildError, VerificationError
from betonbuild.workflow.status import status
from betonbuild.workflow_files import profile_names, snakefile


def _inspect(args) -> int:
    """Any .beton, also one betonbuild did not write; custom fields need --custom to show their values."""
    # why local: the reader needs numpy, which `betonbuild --help` and the other commands need not import
    from betonbuild.beton.describe import as_text, describe, describe_incomplete
    from betonbuild.beton.format import BetonFile, UnregisteredCustomField
    from betonbuild.loading import shipped_handlers

    # betonbuild's own kinds (ragged_ndarray, text...) name their class in the file: no --custom needed
    handlers = {**shipped_handlers(args.file), **_custom_handlers(args.custom)}
    try:
        info = describe(BetonFile(args.file, custom_handlers=handlers), samples=args.samples, digest=args.digest)
    except UnregisteredCustomField as exc:
        info = describe_incomplete(args.file, exc)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        print(as_text(info))
    return 2 if info.get("structure_ok") is False else 0


def _custom_handlers(items: list[str]) -> dict[str, type]:
    """``--custom NAME=pkg.module:Class`` options as the reader's ``custom_handlers`` ({field name: class})."""
    from betonbuild.fields.custom import load_class  # why local: it imports numpy (see _inspect)

    handlers = {}
    for item in items or []:
        name, sep, path = item.partition("=")
        if not sep:
            raise BetonbuildError(f"--custom {item!r}: write NAME=pkg.module:Class")
        handlers[name] = load_class(path, f"--custom {name}")
    return handlers


def _repro(args) -> int:
    from betonbuild.write.failure import replay  # why local: it imports numpy, yaml and jsonschema

    try:
        values, sizes = replay(args.directory)
    except BetonbuildError as exc:
        traceback.print_exc()
        print(f"\nreproduced: {exc}", file=sys.stderr)
        return 1
    print(f"the saved sample now passes every check; allocations (bytes per field): {sizes}")
    return 0


def _dataset(config_path: str, name: str):
    from betonbuild.config.load import load_config_file  # why local: yaml and jsonschema, not needed by inspect

    datasets = load_config_file(config_path).datasets
    if name not in datasets:
        raise BetonbuildError(f"{config_path} has no dataset {name!r} (it has {sorted(datasets)})")
    return datasets[name]


def _manifest(spec, directory: str, hash_inputs: bool = True) -> str:
    """The source manifest (and, for shards, the shard list) in a scratch directory. ``hash_inputs``
    False (``write``): the input files are counted, not read for their digest, which nothing of a
    direct write keeps (the manifest is scratch; the write record names the rows, not the inputs)."""
    # why local: the stages import every part of the library (numpy, yaml, the sources)
    from betonbuild.sources import needs_shard_list
    from betonbuild.workflow.stages import make_shard_list, make_source_manifest

    if needs_shard_list(spec):
        make_shard_list(spec, os.path.join(directory, "shards.json"))
    manifest = os.path.join(directory, "source.json")
    make_source_manifest(spec, manifest, plan_parts=False, hash_inputs=hash_inputs)  # one file, never parts
    return manifest


def _write(args) -> int:
    from betonbuild.workflow.stages import build  # why local: see _manifest

    spec = _dataset(args.config, args.dataset)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = _manifest(spec, tmp, hash_inputs=False)
        record = build(
            spec,
            manifest,
            args.output,
            args.output + ".write.json",
            threads=args.workers,
            smoke=args.smoke,
            evidence=False,
        )
    print(json.dumps(record, indent=2))
    return 0


def _verify(args) -> int:
    """The workflow's report for one file: same checks, same JSON; exit 1 if a check fails."""
    # why local: verification imports numpy and the whole library (see _manifest)
    from betonbuild.config.load import spec_from_dict
    from betonbuild.verify import start_loader_process
    from betonbuild.workflow.stages import verify_dataset

    spec = _dataset(args.config, args.dataset)
    if args.mode:
        spec = spec_from_dict({**spec.to_dict(), "verify": {**spec.verify, "mode": args.mode}})
    record = args.record or _write_record(args.file)
    threads = args.threads or len(os.sched_getaffinity(0))
    loader = start_loader_process(spec, threads)  # imports ffcv in its own process while the manifest is made
    try:
        with tempfile.TemporaryDirectory() as tmp:
            manifest = _manifest(spec, tmp)
            report_path, failed_path = os.path.join(tmp, "report.json"), os.path.join(tmp, "failed.json")
            try:
                verify_dataset(
                    spec,
                    manifest,
                    args.file,
                    record,
                    report_path,
                    failed_path,
                    smoke=args.smoke,
                    threads=threads,
                    loader=loader,
                )
                failure = None
            except VerificationError as exc:
                report_path, failure = failed_path, exc
            with open(report_path) as fh:
                text = fh.read()
    finally:
        if loader is not None:
            loader.close()
    if args.output:
        with atomic_path(args.output) as tmp_out:
            tmp_out.write_text(text)
    else:
        print(text, end="")
    if failure is not None:
        print(f"betonbuild error: {str(failure).split(' (full report kept at')[0]}", file=sys.stderr)
        return 1
    return 0


def _write_record(beton_path: str) -> str:
    """The write record next to the file: results/{ds}/{ds}.write.json, or FILE.write.json (betonbuild write)."""
    stem = beton_path[: -len(".beton")] if beton_path.endswith(".beton") else beton_path
    candidates = [stem + ".write.json", beton_path + ".write.json"]
    for path in candidates:
        if os.path.exists(path):
            return path
    raise BetonbuildError(
        f"no write record for {beton_path} (looked for {' and '.join(candidates)}); it holds the rows written "
        "and the writer's ffcv build, which the report checks; pass --record PATH"
    )


def _status(args) -> int:
    from betonbuild.config.load import load_config_file  # why local: see _dataset
    from betonbuild.project.run import project_config  # why local: the CLI's other commands need none of it

    project = Path(args.directory)
    configfile = args.configfile or str(project_config(project))
    datasets = list(load_config_file(configfile).datasets)
    extra = ["--configfile", configfile, "-s", args.snakefile or str(snakefile()), "-d", args.directory]
    text, code = status(datasets, extra + args.snakemake_args)
    print(text)
    return code


def _run(args) -> int:
    from betonbuild.project.run import run  # why local: see _status

    return run(Path(args.directory).resolve(), args.snakemake_args)


def _init(args) -> int:
    # why local: see _status (guess imports yaml, numpy and PIL)
    from betonbuild.project.guess import guess
    from betonbuild.project.starter import write_project

    directory = Path(args.directory)
    found = guess(Path(args.from_path), directory) if args.from_path else None
    written = write_project(directory, found.entry() if found else None)
    if found:
        print(f"dataset {found.name!r} from {args.from_path}:")
        print("\n".join(f"  {note}" for note in found.notes))
    print(f"wrote {', '.join(str(p) for p in written)}")
    print(f"next: cd {directory} && betonbuild run --cores 4")
    return 0


def _schema(args) -> int:
    from betonbuild.config.load import schema  # why local: see _dataset

    print(json.dumps(schema(), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="betonbuild", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "inspect",
        help="describe any .beton: header, fields, pages, bytes per field, structure, first samples",
        description="Describes any .beton (also one betonbuild did not write) without ffcv's Loader: header, "
        "fields with decoded arguments, sample count, pages and fill ratio, bytes per field, the "
        "structural checks, and the first samples. Exit status 2 if a structural check fails.",
    )
    p.add_argument("file")
    p.add_argument("--samples", type=int, default=3, metavar="N", help="summarise the first N samples (default 3)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--digest", action="store_true", help="also compute the content digest (reads every payload)")
    p.add_argument(
        "--custom",
        action="append",
        metavar="NAME=pkg.module:Class",
        help="register the class of custom (type id 255) field NAME; repeatable",
    )
    p.set_defaults(func=_inspect)
    p = sub.add_parser("repro", help="replay a saved failing sample (results/{ds}/failure) in one process")
    p.add_argument("directory")
    p.set_defaults(func=_repro)
    for name, func, help_text in (
        ("write", _write, "write one dataset of a config to a .beton"),
        ("verify", _verify, "the workflow's verification report for one .beton"),
    ):
        p = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        p.add_argument("--config", required=True)
        p.add_argument("--dataset", required=True)
        p.add_argument("--smoke", action="store_true", help="only the smoke samples")
        if name == "write":
            p.add_argument("--output", required=True)
            p.add_argument("--workers", type=int, default=None, help="overrides writer.num_workers = -1")
        else:
            p.add_argument("file")
            p.add_argument(
                "--record", help="the write record (default: {ds}.write.json or FILE.write.json beside FILE)"
            )
            p.add_argument("--threads", type=int, default=None, help="default: every CPU this process may use")
            p.add_argument("--mode", choices=["auto", "full", "sample"], help="overrides the config's verify.mode")
            p.add_argument("--output", help="write the report here instead of printing it")
        p.set_defaults(func=func)
    p = sub.add_parser(
        "init",
        help="write a starter project: config.yaml (every source kind as an example), an adapter, a README",
        description="Writes DIRECTORY/config.yaml, mydatasets.py (an example adapter) and README.md. With --from "
        "PATH the first dataset is guessed from what is at PATH (an image folder, .npy/.npz arrays, .tar "
        "shards, Parquet files, a Hugging Face save_to_disk directory), and the guess is printed.",
    )
    p.add_argument("directory")
    p.add_argument("--from", dest="from_path", metavar="PATH", help="guess the first dataset from PATH")
    p.set_defaults(func=_init)
    p = sub.add_parser(
        "run",
        allow_abbrev=False,
        help="build and verify every dataset of a project (the packaged workflow; Snakemake options pass through)",
        description="Runs the packaged workflow in the project directory with its config.yaml as the only config "
        "and the default profile applied. Every other argument is Snakemake's: targets, --cores, -n, "
        "--report report.html, --executor slurm, --profile NAME (packaged profiles by name: "
        f"{', '.join(profile_names())}).",
    )
    p.set_defaults(func=_run, passes_snakemake_args=True)
    p = sub.add_parser(
        "status", allow_abbrev=False, help="which datasets are up to date, and why the others would rebuild"
    )
    p.add_argument("-s", "--snakefile", help="default: the packaged Snakefile")
    p.set_defaults(func=_status, passes_snakemake_args=True)
    p.add_argument("--configfile", help="default: DIRECTORY/config.yaml (or DIRECTORY/config/config.yaml)")
    for p in (sub.choices["run"], sub.choices["status"]):
        p.add_argument("-d", "--directory", default=".", help="the project directory (default: .)")
    p = sub.add_parser(
        "schema",
        help="print the whole config schema (JSON Schema), every source and field kind's own keys included",
    )
    p.set_defaults(func=_schema)
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "passes_snakemake_args", False):
        args.snakemake_args = rest[1:] if rest[:1] == ["--"] else rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return args.func(args)
    except BetonbuildError as exc:
        print(f"betonbuild error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
