"""Partitioned writes: the plan, the part jobs and their merge, reproducible bytes, incremental rebuilds.

The library tests run the stages in this process; the workflow tests run real snakemake on one
project (arrays with a shuffle, an image folder, WebDataset shards, a python factory with a custom
field) and then edit its sources, asserting exactly which jobs ran.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import make_digits_npz, make_photo_folder, run_snakemake, write_config

from betonbuild.beton.digest import content_digest
from betonbuild.beton.format import BetonFile
from betonbuild.config.load import load_config
from betonbuild.custom import FixedUTF8Field
from betonbuild.errors import ConfigError, MergeError
from betonbuild.workflow.partitions import partition_bounds
from betonbuild.workflow.stages import build, make_source_manifest, merge_parts

# numba's dispatcher finalizer raises KeyError when ffcv.Loader objects are collected (ffcv 1.0.2, harmless).

DIGIT_FIELDS = {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}}

NAMES_ADAPTER = """
import numpy as np


class Named:
    def __len__(self):
        return 30

    def __getitem__(self, i):
        return {"name": f"sample n°{i}", "x": np.full(3, i, dtype=np.float32), "y": i}


def make():
    return Named()
"""


def digits_entry(path: str = "digits.npz", **extra) -> dict:
    return {
        "source": {"kind": "arrays", "path": path, "columns": {"image": "images", "label": "target"}},
        "fields": DIGIT_FIELDS,
        "smoke": {"samples": 4},
        **extra,
    }


def spec_of(entry: dict, name: str = "d"):
    return load_config({"datasets": {name: entry}}).datasets[name]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def jobs_run(result: subprocess.CompletedProcess) -> Counter:
    """(rule, dataset, part or None) of every job the run executed, from Snakemake's log."""
    jobs = Counter()
    text = result.stdout + result.stderr
    for rule, body in re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):\n((?:    .*\n)+)", text, re.M):
        ds = re.search(r"wildcards: ds=([\w-]+)", body)
        part = re.search(r"part=(\d+)", body)
        if ds:
            jobs[(rule, ds.group(1), int(part.group(1)) if part else None)] += 1
    return jobs


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------


def test_partitions_are_even_contiguous_slices_of_the_order():
    spec = spec_of(digits_entry(partitions=4))
    assert partition_bounds(spec, 10) == [(0, 2), (2, 5), (5, 8), (8, 10)]
    assert partition_bounds(spec_of(digits_entry(samples_per_partition=4)), 10) == [(0, 4), (4, 8), (8, 10)]
    assert partition_bounds(spec_of(digits_entry(samples_per_partition=40)), 10) == [(0, 10)]


def test_webdataset_partitions_are_groups_of_whole_shards():
    entry = {
        "source": {"kind": "webdataset", "shards": "s-{0..4}.tar", "keys": {"x": "cls"}},
        "fields": {"x": {"type": "int"}},
    }
    counts = [10, 10, 30, 10, 10]
    assert partition_bounds(spec_of({**entry, "partitions": 2}), 70, counts) == [(0, 20), (20, 70)]
    assert partition_bounds(spec_of({**entry, "partitions": 5}), 70, counts) == [
        (0, 10),
        (10, 20),
        (20, 50),
        (50, 60),
        (60, 70),
    ]
    assert partition_bounds(spec_of({**entry, "samples_per_partition": 25}), 70, counts) == [
        (0, 20),
        (20, 50),
        (50, 70),
    ]
    with pytest.raises(ConfigError, match=r"datasets\.d\.partitions.*6 partitions for 5 shards"):
        partition_bounds(spec_of({**entry, "partitions": 6}), 70, counts)


def test_more_partitions_than_samples_is_a_config_error_naming_the_dataset():
    with pytest.raises(ConfigError, match=r"datasets\.d\.partitions: 11 partitions for 10 samples"):
        partition_bounds(spec_of(digits_entry(partitions=11)), 10)


def test_partitions_and_samples_per_partition_together_are_refused():
    with pytest.raises(ConfigError, match=r"datasets\.d.*`partitions` or `samples_per_partition`, not both"):
        spec_of(digits_entry(partitions=2, samples_per_partition=10))


# ---------------------------------------------------------------------------------------------
# The stages, in this process
# ---------------------------------------------------------------------------------------------


def write_in_parts(workdir: Path, entry: dict) -> tuple[Path, dict]:
    """The stages a partitioned build runs: manifest, every part, the merge. Returns the .beton."""
    spec = spec_of(entry)
    out = workdir / f"out-{entry.get('partitions')}"
    manifest = make_source_manifest(spec, str(out / "source.json"))
    parts = [str(out / f"parts/{i}.beton") for i in range(len(manifest["partitions"]))]
    records = [p.replace(".beton", ".write.json") for p in parts]
    if len(parts) == 1:
        build(spec, str(out / "source.json"), str(out / "d.beton"), str(out / "d.write.json"), threads=1)
        return out / "d.beton", manifest
    for i, (part, record) in enumerate(zip(parts, records)):
        build(spec, str(out / "source.json"), part, record, part=i)
    merge_parts(spec, str(out / "source.json"), parts, records, str(out / "d.beton"), str(out / "d.write.json"))
    return out / "d.beton", manifest


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    make_digits_npz(tmp_path / "digits.npz", n=120)
    return tmp_path


def test_one_and_eight_partitions_hold_the_same_content(project: Path):
    entry = digits_entry(writer={"shuffle": True, "seed": 3})
    one, _ = write_in_parts(project, {**entry, "partitions": 1})
    eight, manifest = write_in_parts(project, {**entry, "partitions": 8})
    assert [p["num_samples"] for p in manifest["partitions"]] == [15] * 8
    assert sha256(one) != sha256(eight)  # another layout: eight parts, each page-aligned
    assert content_digest(BetonFile(one)) == content_digest(BetonFile(eight))
    assert BetonFile(eight).num_samples == 120


def test_a_stale_part_is_refused_by_the_merge(project: Path):
    entry = digits_entry(partitions=3)
    beton, manifest = write_in_parts(project, entry)
    out = beton.parent
    record_path = out / "parts/1.write.json"
    record = json.loads(record_path.read_text())
    record["fingerprint"] = "0" * 64  # written from other source content than the manifest now plans
    record_path.write_text(json.dumps(record))
    beton.unlink()
    parts = [str(out / f"parts/{i}.beton") for i in range(3)]
    with pytest.raises(MergeError, match=r"dataset 'd': part 1 .* was written for other source content"):
        merge_parts(
            spec_of(entry),
            str(out / "source.json"),
            parts,
            [p.replace(".beton", ".write.json") for p in parts],
            str(beton),
            str(out / "d.write.json"),
        )
    assert not beton.exists()


def test_a_merged_file_whose_rows_differ_from_a_verified_part_fails_the_parts_check(project: Path):
    from betonbuild.beton.digest import range_digest
    from betonbuild.sources import open_source
    from betonbuild.verify import verify_beton

    entry = digits_entry(partitions=3)
    beton, manifest = write_in_parts(project, entry)
    out = beton.parent
    parts = [
        {
            "index": p["index"],
            "start": p["start"],
            "stop": p["stop"],
            "range_digest": range_digest(BetonFile(out / f"parts/{p['index']}.beton"), 0, p["num_samples"]),
        }
        for p in manifest["partitions"]
    ]
    spec = spec_of(entry)
    source = open_source(spec)
    rows = np.arange(120)
    record = json.loads((out / "d.write.json").read_text())
    report = verify_beton(spec, source, rows, str(beton), record["provenance"], parts=parts)
    assert report["ok"] and report["mode"] == "sample"
    parts[2]["range_digest"] = "0" * 64  # as if part 2 had been verified with other content
    report = verify_beton(spec, source, rows, str(beton), record["provenance"], parts=parts)
    check = next(c for c in report["checks"] if c["name"] == "parts")
    assert not report["ok"] and not check["ok"] and check["differing"] == [2]


def test_a_changed_row_changes_exactly_its_parts_fingerprint(project: Path):
    entry = digits_entry(partitions=4, writer={"shuffle": True, "seed": 1})
    spec = spec_of(entry)
    before = make_source_manifest(spec, "a.json")["partitions"]
    data = dict(np.load("digits.npz"))
    data["images"][17, 3, 3] ^= 1
    np.savez("digits.npz", **data)
    after = make_source_manifest(spec, "b.json")["partitions"]
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a["fingerprint"] != b["fingerprint"]]
    order = np.random.default_rng(1).permutation(120)
    position = int(np.flatnonzero(order == 17)[0])
    assert changed == [next(p["index"] for p in after if p["start"] <= position < p["stop"])]
    assert [a["rows_sha256"] for a in before] == [b["rows_sha256"] for b in after]


@pytest.mark.parametrize("shuffle", [False, True], ids=["contiguous rows", "shuffled rows"])
def test_array_part_fingerprints_are_their_rows_bytes_and_make_up_the_source_fingerprint(project, monkeypatch, shuffle):
    """Rows are hashed in bounded blocks (here a few rows each), straight from the memory map when
    they are a contiguous run; the files are not hashed a second time."""
    import blake3

    import betonbuild.sources.arrays as arrays
    from betonbuild.sources import open_source
    from betonbuild.workflow.partitions import parts_digest

    x = np.random.default_rng(0).integers(0, 255, (100, 7, 5), dtype=np.uint8)
    np.save("x.npy", x)
    np.save("y.npy", np.arange(100) * 3)
    spec = spec_of(
        {
            "source": {"kind": "arrays", "columns": {"x": "x.npy", "y": "y.npy"}},
            "fields": {"x": {"type": "ndarray", "dtype": "uint8", "shape": [7, 5]}, "y": {"type": "int"}},
            "partitions": 3,
            "writer": {"shuffle": shuffle, "seed": 4},
        }
    )
    monkeypatch.setattr(arrays, "HASH_BLOCK_BYTES", 100)  # 2 rows of x per block
    manifest = make_source_manifest(spec, "m.json")
    order = np.random.default_rng(4).permutation(100) if shuffle else np.arange(100)
    adapters = manifest["inputs"]["adapters_sha256"]
    for part in manifest["partitions"]:
        rows = order[part["start"] : part["stop"]]
        content = blake3.blake3()
        for column in open_source(spec).columns:
            content.update(f"{column.dtype.str}{column.shape[1:]}\n".encode() + np.asarray(column)[rows].tobytes())
        assert part["fingerprint"] == hashlib.sha256(f"{adapters}\0{content.hexdigest()}".encode()).hexdigest()
    assert manifest["inputs"]["sha256"] == parts_digest(manifest["partitions"])
    assert manifest["inputs"]["files"] == 2 and manifest["inputs"]["bytes"] > x.nbytes


# ---------------------------------------------------------------------------------------------
# The workflow
# ---------------------------------------------------------------------------------------------


def write_photo_shards(root: Path, shards: int = 4, per_shard: int = 5) -> str:
    import webdataset as wds

    from betonbuild.demo import colour_photos, crops

    photos = sorted(colour_photos().items())
    root.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        with wds.TarWriter(str(root / f"p-{s}.tar")) as sink:
            for k in range(per_shard):
                label, (name, image) = (s * per_shard + k) % len(photos), photos[(s * per_shard + k) % len(photos)]
                crop = crops(image, size=48, count=s + 1)[-1]
                sink.write({"__key__": f"{name}_{s}_{k}", "jpg": _jpeg(crop), "cls": label})
    return str(root / f"p-{{0..{shards - 1}}}.tar")


def _jpeg(image: np.ndarray) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(image).save(out, format="JPEG", quality=95)
    return out.getvalue()


def project_datasets(workdir: Path) -> dict:
    shards = write_photo_shards(workdir / "shards")
    return {
        "digits": digits_entry(partitions=4, writer={"shuffle": True, "seed": 0}),
        "photos": {
            "source": {"kind": "image_folder", "root": "photos"},
            "fields": {"image": {"type": "rgb_image", "write_mode": "jpg"}, "label": {"type": "int"}},
            "samples_per_partition": 4,
            "smoke": {"samples": 2},
            "verify": {"mode": "full"},
        },
        "shards": {
            "source": {"kind": "webdataset", "shards": shards, "keys": {"image": "jpg", "label": "cls"}},
            "fields": {"image": {"type": "rgb_image", "write_mode": "raw"}, "label": {"type": "int"}},
            "partitions": 2,
            "smoke": {"samples": 2},
        },
        "names": {
            "source": {"kind": "python", "factory": "names:make"},
            "fields": {
                "name": {"type": "custom", "class": "betonbuild.custom:FixedUTF8Field", "args": {"width": 20}},
                "x": {"type": "ndarray", "dtype": "float32", "shape": [3]},
                "y": {"type": "int"},
            },
            "partitions": 3,
            "keep_parts": False,
            "smoke": {"samples": 2},
        },
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    workdir = tmp_path_factory.mktemp("partitioned")
    make_digits_npz(workdir / "digits.npz", n=200)
    make_photo_folder(workdir / "photos", per_class=5, size=40)
    (workdir / "names.py").write_text(NAMES_ADAPTER)
    write_config(workdir, project_datasets(workdir))
    return workdir, run_snakemake(workdir, "all", timeout=600)


def test_every_partitioned_dataset_is_merged_and_verified(built):
    workdir, result = built
    jobs = jobs_run(result)
    assert {part for (rule, ds, part) in jobs if rule == "write_part" and ds == "digits"} == {0, 1, 2, 3}
    assert {part for (rule, ds, part) in jobs if rule == "write_part" and ds == "photos"} == {0, 1, 2}  # 10 images / 4
    assert {part for (rule, ds, part) in jobs if rule == "write_part" and ds == "shards"} == {0, 1}
    assert not any(rule == "write" for rule, _, _ in jobs), "a partitioned dataset is never written directly"
    for ds in ("digits", "photos", "shards", "names"):
        assert jobs[("merge", ds, None)] == 1
        report = json.loads((workdir / f"results/{ds}/{ds}.verify.json").read_text())
        assert report["ok"], (ds, report["worst"])
        record = json.loads((workdir / f"results/{ds}/{ds}.write.json").read_text())
        assert sum(p["num_samples"] for p in record["partitions"]) == report["num_samples"]["found"]
        # every part was decoded and compared in full; the merged file is proven to hold exactly them
        assert report["mode"] == ("full" if ds == "photos" else "sample")  # photos asks for mode: full
        assert next(c for c in report["checks"] if c["name"] == "parts")["ok"]
        for i in range(len(record["partitions"])):
            part_report = json.loads((workdir / f"results/{ds}/parts/{i}.verify.json").read_text())
            assert part_report["ok"] and part_report["mode"] == "full" and part_report["stage"] == f"part {i}"
    shards = json.loads((workdir / "results/shards/source.json").read_text())["partitions"]
    assert [(p["start"], p["stop"]) for p in shards] == [(0, 10), (10, 20)]  # two shards each


def test_the_merged_file_reads_back_through_ffcv_loader_in_random_order(built):
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.decoders import NDArrayDecoder
    from ffcv.loader import Loader, OrderOption

    workdir, _ = built
    data = np.load(workdir / "digits.npz")
    order = np.random.default_rng(0).permutation(200)
    for os_cache in (True, False):
        loader = Loader(
            str(workdir / "results/digits/digits.beton"),
            batch_size=16,
            order=OrderOption.RANDOM,
            os_cache=os_cache,
            drop_last=False,
            seed=5,
            pipelines={"image": [NDArrayDecoder()], "label": [IntDecoder()]},
        )
        images, labels = [], []
        for image, label in loader:
            images.append(np.array(image))  # copies: the Loader reuses its batch buffers
            labels.append(np.array(label).ravel())
        images, labels = np.concatenate(images), np.concatenate(labels)
        by_label_sum = sorted(zip(labels.tolist(), images.reshape(200, -1).sum(1).tolist()))
        expected = sorted(zip(data["target"][order].tolist(), data["images"][order].reshape(200, -1).sum(1).tolist()))
        assert by_label_sum == expected


def test_parts_are_kept_unless_keep_parts_is_false(built):
    workdir, _ = built
    assert sorted(p.name for p in (workdir / "results/digits/parts").glob("*.beton")) == [
        f"{i}.beton" for i in range(4)
    ]
    assert not list(workdir.glob("results/names/parts/*.beton")), "temp files: Snakemake deleted them after the merge"
    names = BetonFile(workdir / "results/names/names.beton", custom_handlers={"name": FixedUTF8Field})
    assert names.num_samples == 30


def test_the_second_run_has_nothing_to_do(built):
    workdir, _ = built
    result = run_snakemake(workdir, "all")
    assert not jobs_run(result)
    assert "Nothing to be done" in result.stdout + result.stderr


def smoke_inspected(workdir: Path, ds: str, monkeypatch) -> set[int]:
    """Source indices of the samples the smoke stage reads: its own and the largest ones."""
    from betonbuild.config.load import load_config_file
    from betonbuild.config.spec import resolve_indices
    from betonbuild.sources import open_source
    from betonbuild.workflow.stages import smoke_rows

    monkeypatch.chdir(workdir)
    spec = load_config_file(workdir / "config.yaml").datasets[ds]
    source = open_source(spec, workdir / "results" / ds)
    rows = smoke_rows(spec, source, resolve_indices(spec.writer, len(source), ds))
    return {int(i) for i in np.concatenate(rows)}


def rerun_only(ds: str, part: int, smoke: bool, shard_list: bool = False) -> set:
    """The jobs a change of one sample of part ``part`` must run, and no other."""
    jobs = {
        ("source_manifest", ds, None),
        ("write_part", ds, part),
        ("verify_part", ds, part),
        ("merge", ds, None),
        ("verify", ds, None),  # and the report's preview and summary
    }
    jobs |= {("smoke", ds, None)} if smoke else set()  # the smoke write and its gate: one job
    return jobs | ({("shard_list", ds, None)} if shard_list else set())


def test_one_changed_row_rewrites_its_part_the_merge_and_the_verification_only(built, monkeypatch):
    """A row that is not a smoke sample: the smoke file and its gate are left alone too."""
    workdir, _ = built
    before = {i: sha256(workdir / f"results/digits/parts/{i}.beton") for i in range(4)}
    smoke_before = sha256(workdir / "results/digits/smoke.beton")
    order = np.random.default_rng(0).permutation(200)
    inspected = smoke_inspected(workdir, "digits", monkeypatch)
    position = next(p for p in range(60, 200) if int(order[p]) not in inspected)
    data = dict(np.load(workdir / "digits.npz"))
    data["images"][order[position], 0, 0] ^= 1
    np.savez(workdir / "digits.npz", **data)
    part = position // 50
    jobs = jobs_run(run_snakemake(workdir, "all"))
    assert set(jobs) == rerun_only("digits", part, smoke=False)
    after = {i: sha256(workdir / f"results/digits/parts/{i}.beton") for i in range(4)}
    assert [i for i in range(4) if before[i] != after[i]] == [part]
    assert sha256(workdir / "results/digits/smoke.beton") == smoke_before
    assert json.loads((workdir / "results/digits/digits.verify.json").read_text())["ok"]


def test_a_changed_smoke_sample_also_rewrites_the_smoke_file_and_its_gate(built):
    workdir, _ = built
    order = np.random.default_rng(0).permutation(200)
    data = dict(np.load(workdir / "digits.npz"))
    data["images"][order[0], 0, 0] ^= 1  # the first sample of the order is always a smoke sample
    np.savez(workdir / "digits.npz", **data)
    jobs = jobs_run(run_snakemake(workdir, "all"))
    assert set(jobs) == rerun_only("digits", 0, smoke=True)
    smoke = json.loads((workdir / "results/digits/smoke.verify.json").read_text())
    assert smoke["ok"] and "inputs" not in smoke["source"]


def test_one_changed_shard_rewrites_its_part_the_merge_and_the_verification_only(built, monkeypatch):
    """The label of one sample of shard 3 (part 1) that the smoke stage does not read."""
    workdir, _ = built
    shard = workdir / "shards/p-3.tar"
    import webdataset as wds

    inspected = smoke_inspected(workdir, "shards", monkeypatch)
    changed = next(k for k in range(5) if 15 + k not in inspected)  # shard 3 holds samples 15-19
    samples = list(wds.WebDataset(str(shard), shardshuffle=False, empty_check=False))
    with wds.TarWriter(str(shard)) as sink:
        for k, sample in enumerate(samples):
            sink.write(
                {"__key__": sample["__key__"], "jpg": sample["jpg"], "cls": str(int(sample["cls"]) + (k == changed))}
            )
    jobs = jobs_run(run_snakemake(workdir, "all"))
    assert set(jobs) == rerun_only("shards", 1, smoke=False, shard_list=True)
    assert json.loads((workdir / "results/shards/shards.verify.json").read_text())["ok"]


def test_the_same_inputs_give_the_same_bytes_whatever_the_cores(built, tmp_path: Path):
    workdir, _ = built
    twin = tmp_path / "twin"
    twin.mkdir()
    for name in ("digits.npz", "config.yaml", "names.py"):
        shutil.copy(workdir / name, twin / name)
    shutil.copytree(workdir / "photos", twin / "photos")
    shutil.copytree(workdir / "shards", twin / "shards")
    datasets = ("digits", "photos", "shards", "names")
    # the files alone (their verification is not what differs with the cores); the last --cores wins
    run_snakemake(twin, "--cores", "1", *(f"results/{ds}/{ds}.beton" for ds in datasets), timeout=600)
    for ds in datasets:
        assert sha256(twin / f"results/{ds}/{ds}.beton") == sha256(workdir / f"results/{ds}/{ds}.beton"), ds
