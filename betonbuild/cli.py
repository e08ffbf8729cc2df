"""``betonbuild inspect|repro|write|verify``: for people troubleshooting by hand."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback

from .errors import BetonbuildError


def _inspect(args) -> int:
    from .beton import BetonFile

    beton = BetonFile(args.file)
    info = {
        "file": args.file,
        "bytes": beton.size,
        "version": beton.version,
        "page_size": beton.page_size,
        "num_samples": beton.num_samples,
        "allocations": int(beton.alloc_table.size),
        "fields": [
            {"name": f.name, "type": f.type_name, "type_id": f.type_id,
             **({"dtype": f.dtype.str, "shape": list(f.shape)} if f.dtype is not None else {})}
            for f in beton.fields
        ],
    }
    print(json.dumps(info, indent=2))
    return 0


def _repro(args) -> int:
    from .failure import replay

    try:
        values, sizes = replay(args.directory)
    except BetonbuildError as exc:
        traceback.print_exc()
        print(f"\nreproduced: {exc}", file=sys.stderr)
        return 1
    print(f"the saved sample now passes every check; allocations (bytes per field): {sizes}")
    return 0


def _dataset(config_path: str, name: str):
    from .spec import load_config_file

    datasets = load_config_file(config_path).datasets
    if name not in datasets:
        raise BetonbuildError(f"{config_path} has no dataset {name!r} (it has {sorted(datasets)})")
    return datasets[name]


def _manifest(spec, directory: str) -> str:
    """The source manifest (and, for shards, the shard list) in a scratch directory."""
    from .stages import make_shard_list, make_source_manifest

    if spec.source["kind"] == "webdataset":
        make_shard_list(spec, os.path.join(directory, "shards.json"))
    manifest = os.path.join(directory, "source.json")
    make_source_manifest(spec, manifest)
    return manifest


def _write(args) -> int:
    from .stages import build

    spec = _dataset(args.config, args.dataset)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = _manifest(spec, tmp)
        record = build(spec, manifest, args.output, args.output + ".write.json", threads=args.workers,
                       smoke=args.smoke)
    print(json.dumps(record, indent=2))
    return 0


def _verify(args) -> int:
    from .stages import verify

    spec = _dataset(args.config, args.dataset)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = _manifest(spec, tmp)
        report_path = os.path.join(tmp, "report.json")
        verify(spec, manifest, args.file, args.file + ".write.json", report_path, args.file + ".failed.verify.json",
               smoke=args.smoke)
        with open(report_path) as fh:
            print(fh.read())
    return 0


def _status(args) -> int:
    from .spec import load_config_file
    from .status import default_snakefile, status

    snakefile = args.snakefile or str(default_snakefile())
    configfile = args.configfile or os.path.join(args.directory, "config", "config.yaml")
    datasets = list(load_config_file(configfile).datasets)
    extra = ["-s", snakefile, "-d", args.directory]
    if args.configfile:
        extra += ["--configfile", args.configfile]
    text, code = status(datasets, extra + args.snakemake_args)
    print(text)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="betonbuild", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="print a .beton's header, fields and counts (no ffcv needed)")
    p.add_argument("file")
    p.set_defaults(func=_inspect)
    p = sub.add_parser("repro", help="replay a saved failing sample (results/{ds}/failure) in one process")
    p.add_argument("directory")
    p.set_defaults(func=_repro)
    for name, func, help_text in (("write", _write, "write one dataset of a config to a .beton"),
                                  ("verify", _verify, "verify a .beton written by `betonbuild write`")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--config", required=True)
        p.add_argument("--dataset", required=True)
        p.add_argument("--smoke", action="store_true", help="only the smoke samples")
        if name == "write":
            p.add_argument("--output", required=True)
            p.add_argument("--workers", type=int, default=None, help="overrides writer.num_workers = -1")
        else:
            p.add_argument("file")
        p.set_defaults(func=func)
    p = sub.add_parser("status", help="which datasets are up to date, and why the others would rebuild")
    p.add_argument("-s", "--snakefile", help="default: the Snakefile of this betonbuild checkout")
    p.add_argument("-d", "--directory", default=".", help="the project directory (default: .)")
    p.add_argument("--configfile", help="default: DIRECTORY/config/config.yaml")
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER, help="more snakemake arguments, after --")
    p.set_defaults(func=_status)
    args = parser.parse_args(argv)
    if getattr(args, "snakemake_args", None) and args.snakemake_args[0] == "--":
        args.snakemake_args = args.snakemake_args[1:]
    try:
        return args.func(args)
    except BetonbuildError as exc:
        print(f"betonbuild error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
