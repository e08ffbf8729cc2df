"""WebDataset sources: the shard list, the indexed reading, the workflow, bad shards, incremental runs.

Shards are written here with webdataset's own TarWriter/ShardWriter from real data: 64x64 crops of
the colour photographs bundled with scikit-image/scikit-learn (JPEG, one as PNG) with a class and
JSON metadata, and sklearn's handwritten digits (.npy + class).

How the cases run (2 cores; a process that imports ffcv costs ~4 s):
- unit tests of ``betonbuild.sources.webdataset`` in this process (no ffcv), among them: the tar scan against
  tarfile (ustar, GNU, PAX; plain and compressed) and webdataset's grouping, damaged tars, and the
  cv2 decode of plain JPEGs against webdataset's rgb8 (real photos, every JPEG flavour, PNG, damage);
- the .beton written with the cv2 decode against the one written with PIL only (one driver process);
- one module-scoped project built once by real ``snakemake all``: ``photos`` (a glob of photo
  shards, keys + decode) and ``digits`` (a brace pattern of ShardWriter shards read through a
  ``pipeline: module:function``); its content tests read the .beton files back; the incremental
  test (last) then edits its shards;
- the bad-shard matrix: ``betonbuild write`` per case (in this process for the cases that must fail
  in the shard list, before ffcv is imported; a process of its own for the others), then one
  ``snakemake --keep-going`` over all of them;
- a shard changed between its shard list and the write: one driver process runs the stages by hand;
- webdataset not installed: snakemake with a ``sitecustomize`` on PYTHONPATH that hides the package.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import BIN, SNAKEFILE, make_digits_npz, run_snakemake, write_config

from betonbuild.config.load import load_config
from betonbuild.errors import ConfigError, SampleError, SourceError
from betonbuild.workflow.status import plan

wds = pytest.importorskip("webdataset")

BETONBUILD = str(BIN / "betonbuild")
PYTHON = str(BIN / "python")
CASE_LIMIT = 60.0  # a bad-shard case that takes longer than this is a hang
JPEG_TOLERANCE = 8.0  # mean absolute error (0-255) of ffcv's q90 JPEG against the source pixels (verify's default)

# ---------------------------------------------------------------------------------------------
# Real samples and shards
# ---------------------------------------------------------------------------------------------


def _jpeg(image: np.ndarray, quality: int = 95, fmt: str = "JPEG") -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(image).save(out, format=fmt, **({"quality": quality} if fmt == "JPEG" else {}))
    return out.getvalue()


_PHOTO_CACHE: list[dict] = []


def photo_samples() -> list[dict]:
    """20 samples: 2 crops (64x64) of each of the 10 bundled photos; jpg (one png), cls, json."""
    if not _PHOTO_CACHE:
        from betonbuild.demo import colour_photos, crops

        for label, (name, image) in enumerate(sorted(colour_photos().items())):
            for k, crop in enumerate(crops(image, size=64, count=2)):
                sample = {"__key__": f"{name}_{k}", "cls": label, "json": {"photo": name, "crop": k}}
                if name == "coffee" and k == 1:
                    sample["png"] = _jpeg(crop, fmt="PNG")  # the `jpg;png` alternative
                else:
                    sample["jpg"] = _jpeg(crop)
                _PHOTO_CACHE.append(sample)
    return [dict(s) for s in _PHOTO_CACHE]


def digit_samples(n: int = 60) -> list[dict]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    return [
        {"__key__": f"digit{i:04d}", "npy": digits.images[i].astype(np.uint8), "cls": int(digits.target[i])}
        for i in range(n)
    ]


def write_shard(path: Path, samples: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(path)) as sink:
        for sample in samples:
            sink.write(sample)
    return path


def decoded_image(sample: dict) -> np.ndarray:
    from PIL import Image

    payload = sample.get("jpg", sample.get("png"))
    return np.asarray(Image.open(io.BytesIO(payload)).convert("RGB"))


PHOTO_FIELDS = {"image": {"type": "rgb_image", "write_mode": "jpg"}, "label": {"type": "int"}, "meta": {"type": "json"}}
PHOTO_KEYS = {"image": "jpg;png", "label": "cls", "meta": "json"}


def photo_dataset(shards, **extra) -> dict:
    return {
        "source": {"kind": "webdataset", "shards": shards, "keys": PHOTO_KEYS, **extra},
        "fields": PHOTO_FIELDS,
        "smoke": {"samples": 3},
    }


def wds_spec(shards, keys=PHOTO_KEYS, fields=PHOTO_FIELDS, name="d", **source):
    entry = {"source": {"kind": "webdataset", "shards": shards, "keys": keys, **source}, "fields": fields}
    return load_config({"datasets": {name: entry}}).datasets[name]


def ran(result: subprocess.CompletedProcess) -> dict[str, set[str]]:
    return {ds: {rule for rule, _ in jobs} for ds, jobs in plan(result.stdout + result.stderr).items()}


# ---------------------------------------------------------------------------------------------
# Unit tests of betonbuild.sources.webdataset (this process, no ffcv)
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def photo_shards(tmp_path, monkeypatch) -> list[Path]:
    monkeypatch.chdir(tmp_path)
    samples = photo_samples()
    return [write_shard(tmp_path / f"s/p-{i}.tar", samples[i * 7 : (i + 1) * 7]) for i in range(3)]


@pytest.mark.parametrize(
    "name",
    [
        "000123.jpg",
        "dir/000123.seg.png",
        "dir.v1/0001.jpg",
        "a/b.c/d.e.f",
        "noext",
        "dir.v1/noext",
        ".hidden",
        "x.",
        "café/0005.JPG",
        "__key__.json",
        "a//b.c",
    ],
)
def test_split_key_is_webdatasets_base_plus_ext(name):
    from webdataset.tariterators import base_plus_ext

    from betonbuild.sources.webdataset import split_key

    assert split_key(name) == tuple(base_plus_ext(name))


def test_the_shard_list_and_the_manifest_do_not_import_webdataset_or_torch(photo_shards):
    """webdataset imports torch (about 1.2 s per job): the jobs that only count do without it."""
    script = (
        "import sys, json\n"
        "from betonbuild.config.spec import load_config\n"
        "from betonbuild.workflow.stages import make_shard_list, make_source_manifest\n"
        f"spec = load_config({{'datasets': {{'d': {json.dumps(photo_dataset('s/p-{0..2}.tar'))}}}}}).datasets['d']\n"
        "make_shard_list(spec, 'r/shards.json')\n"
        "make_source_manifest(spec, 'r/source.json')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('webdataset', 'torch'))))\n"
    )
    Path("r").mkdir()
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == []
    assert json.loads(Path("r/source.json").read_text())["length"] == 20


def test_count_shard_counts_samples_and_keys_from_headers(photo_shards):
    from betonbuild.sources.webdataset import count_shard

    spec = wds_spec("s/p-*.tar")
    counted = {name: count_shard(spec, f"s/{name}") for name in ("p-0.tar", "p-1.tar", "p-2.tar")}
    assert {name: (c["samples"], c["keys"]) for name, c in counted.items()} == {
        "p-0.tar": (7, ["cls", "jpg", "json"]),
        "p-1.tar": (7, ["cls", "jpg", "json", "png"]),  # coffee_1
        "p-2.tar": (6, ["cls", "jpg", "json"]),
    }


def _payload_bytes_per_sample(paths) -> list[int]:
    """Every sample's payload bytes, in dataset order, as tarfile reads them."""
    import tarfile

    sizes = []
    for path in paths:
        with tarfile.open(path) as tar:
            keys = {}
            for member in tar:
                keys[member.name.split(".")[0]] = keys.get(member.name.split(".")[0], 0) + member.size
            sizes += list(keys.values())
    return sizes


def test_the_preflight_finds_the_largest_samples_from_tar_headers(photo_shards):
    """count_shard keeps each shard's largest samples; together they hold the dataset's largest."""
    from betonbuild.config.spec import LARGEST_SAMPLES
    from betonbuild.sources.webdataset import WebDatasetSource, shard_list
    from betonbuild.write.preflight import largest_rows

    spec = wds_spec("s/p-{0..2}.tar")
    Path("shards.json").write_text(json.dumps(shard_list(spec, "cache.json")))
    source = WebDatasetSource(spec, "shards.json")
    truth = np.array(_payload_bytes_per_sample(photo_shards))
    assert len(truth) == len(source) == 20
    order = np.arange(20)
    expected = np.sort(np.argsort(truth, kind="stable")[::-1][:LARGEST_SAMPLES])
    assert largest_rows(source, order).tolist() == expected.tolist()
    assert source.sample_sizes()[expected].tolist() == truth[expected].tolist()


def test_count_shard_does_not_decode_payloads(tmp_path, monkeypatch):
    """A payload no decoder could read is counted: counting looks at tar headers only."""
    from betonbuild.sources.webdataset import count_shard

    monkeypatch.chdir(tmp_path)
    samples = photo_samples()[:3]
    samples[1]["jpg"] = b"not a jpeg at all"
    write_shard(tmp_path / "x.tar", samples)
    assert count_shard(wds_spec("x.tar"), "x.tar")["samples"] == 3


def test_count_shard_names_shard_key_and_field_of_a_missing_member(tmp_path, monkeypatch):
    from betonbuild.sources.webdataset import count_shard

    monkeypatch.chdir(tmp_path)
    samples = photo_samples()[:4]
    del samples[2]["cls"]
    write_shard(tmp_path / "x.tar", samples)
    with pytest.raises(SampleError) as info:
        count_shard(wds_spec("x.tar"), "x.tar")
    message = str(info.value)
    assert "shard x.tar" in message and f"key {samples[2]['__key__']}" in message, message
    assert "field 'label'" in message and "cls" in message, message


def test_count_shard_with_a_pipeline_does_not_require_the_keys(tmp_path, monkeypatch):
    from betonbuild.sources.webdataset import count_shard

    monkeypatch.chdir(tmp_path)
    samples = photo_samples()[:2]
    del samples[1]["json"]
    write_shard(tmp_path / "x.tar", samples)
    assert count_shard(wds_spec("x.tar", keys=None, pipeline="mod:fn"), "x.tar")["samples"] == 2


@pytest.mark.parametrize("adjacent", [True, False])
def test_count_shard_refuses_a_duplicate_sample_key(tmp_path, monkeypatch, adjacent):
    from betonbuild.sources.webdataset import count_shard

    monkeypatch.chdir(tmp_path)
    samples = photo_samples()[:3]
    twin = dict(samples[0])
    samples.insert(1 if adjacent else 3, twin)
    write_shard(tmp_path / "x.tar", samples)
    with pytest.raises(SourceError) as info:
        count_shard(wds_spec("x.tar"), "x.tar")
    assert "shard x.tar" in str(info.value) and repr(twin["__key__"]) in str(info.value), str(info.value)


def test_expand_shards_brace_glob_and_list(tmp_path, monkeypatch):
    from betonbuild.sources.webdataset import expand_shards

    monkeypatch.chdir(tmp_path)
    for name in ("b-10.tar", "b-2.tar", "a-0.tar", "a-1.tar"):
        (tmp_path / name).write_bytes(b"")
    assert expand_shards(wds_spec("x-{0000..0002}.tar")) == ["x-0000.tar", "x-0001.tar", "x-0002.tar"]
    assert expand_shards(wds_spec("b-*.tar")) == ["b-10.tar", "b-2.tar"]  # sorted by name
    assert expand_shards(wds_spec(["b-2.tar", "a-{0..1}.tar", "b-1*.tar"])) == [
        "b-2.tar",
        "a-0.tar",
        "a-1.tar",
        "b-10.tar",
    ]  # list order kept, each item expanded in place
    with pytest.raises(SourceError, match="matches no file"):
        expand_shards(wds_spec("c-*.tar"))
    with pytest.raises(SourceError, match="listed twice"):
        expand_shards(wds_spec(["a-0.tar", "a-{0..1}.tar"]))


def test_shard_list_entries(photo_shards):
    from betonbuild.sources import sha256_file
    from betonbuild.sources.webdataset import shard_list

    listing = shard_list(wds_spec("s/p-{0..2}.tar"), "cache.json")
    assert listing["samples"] == 20 and listing["dataset"] == "d"
    for entry, path in zip(listing["shards"], photo_shards):
        stat = path.stat()
        assert entry["path"] == f"s/{path.name}"
        assert (entry["size"], entry["mtime_ns"]) == (stat.st_size, stat.st_mtime_ns)
        assert entry["sha256"] == sha256_file(path)
    assert [e["samples"] for e in listing["shards"]] == [7, 7, 6]


def test_shard_list_recounts_only_the_added_and_the_changed_shard(photo_shards, monkeypatch):
    import betonbuild.sources.webdataset as wds_module

    calls: list[str] = []
    real = wds_module.count_shard
    monkeypatch.setattr(wds_module, "count_shard", lambda spec, path: calls.append(path) or real(spec, path))
    spec = wds_spec("s/p-*.tar")
    first = wds_module.shard_list(spec, "cache.json")
    assert sorted(calls) == ["s/p-0.tar", "s/p-1.tar", "s/p-2.tar"]

    calls.clear()
    assert wds_module.shard_list(spec, "cache.json") == first
    assert calls == []

    samples = photo_samples()
    write_shard(Path("s/p-1.tar"), samples[7:13])  # one sample fewer
    write_shard(Path("s/p-3.tar"), samples[:2])
    calls.clear()
    second = wds_module.shard_list(spec, "cache.json")
    assert sorted(calls) == ["s/p-1.tar", "s/p-3.tar"]
    assert [e["samples"] for e in second["shards"]] == [7, 6, 6, 2]
    assert second["shards"][0] == first["shards"][0] and second["shards"][2] == first["shards"][2]

    Path("s/p-0.tar").unlink()
    calls.clear()
    third = wds_module.shard_list(spec, "cache.json")
    assert calls == [] and [e["path"] for e in third["shards"]] == ["s/p-1.tar", "s/p-2.tar", "s/p-3.tar"]


def test_shard_list_of_a_missing_shard_names_it(photo_shards):
    from betonbuild.sources.webdataset import shard_list

    with pytest.raises(SourceError, match=r"shard s/p-3\.tar does not exist"):
        shard_list(wds_spec("s/p-{0..3}.tar"), "cache.json")


def test_the_smoke_fingerprint_covers_exactly_its_samples_bytes(photo_shards):
    """samples_digest reads the chosen samples' members at their offsets: a change to another sample
    of the same shard leaves it alone; a compressed shard (no offsets) counts as a whole."""
    import gzip

    from betonbuild.sources.webdataset import WebDatasetSource, samples_digest, shard_list

    spec = wds_spec("s/p-{0..2}.tar")

    def digest(rows) -> str:
        Path("shards.json").write_text(json.dumps(shard_list(spec, "cache.json")))
        return samples_digest(WebDatasetSource(spec, "shards.json"), np.array(rows))

    samples = photo_samples()
    chosen = [0, 8, 9]  # shard 0's first sample, shard 1's second and third
    first = digest(chosen)
    assert digest([0, 8]) != first and digest(chosen) == first
    samples[10]["cls"] = 99  # shard 1, after the chosen ones
    samples[7]["json"] = {"photo": "a longer value that shifts every later member"}  # before them
    write_shard(photo_shards[1], samples[7:14])
    assert digest(chosen) == first
    image = "jpg" if "jpg" in samples[9] else "png"
    flipped = bytearray(samples[9][image])
    flipped[len(flipped) // 2] ^= 0xFF  # the same size: only the bytes read at its offset tell
    samples[9][image] = bytes(flipped)
    write_shard(photo_shards[1], samples[7:14])
    flipped_digest = digest(chosen)
    assert flipped_digest != first
    samples[9]["json"] = {"photo": "changed"}  # another member of a chosen sample
    write_shard(photo_shards[1], samples[7:14])
    changed = digest(chosen)
    assert changed != flipped_digest
    zipped = Path("s/p-1.tar")
    zipped.write_bytes(gzip.compress(zipped.read_bytes()))  # same name: webdataset sniffs the bytes
    assert digest(chosen) != changed  # shard 1 now counts by its sha256
    samples[10]["cls"] = 98
    before = digest(chosen)
    zipped.write_bytes(gzip.compress(write_shard(Path("plain.tar"), samples[7:14]).read_bytes()))
    assert digest(chosen) != before  # any change of a compressed shard counts


def test_indexed_source_reads_every_sample_in_shard_order(photo_shards):
    from betonbuild.sources.webdataset import WebDatasetSource, shard_list

    spec = wds_spec("s/p-*.tar")
    Path("shards.json").write_text(json.dumps(shard_list(spec, "cache.json")))
    source = WebDatasetSource(spec, "shards.json")
    expected = photo_samples()
    assert len(source) == 20
    assert source.location(0) == (0, 0) and source.location(7) == (1, 0) and source.location(19) == (2, 5)
    for index in [0, 1, 6, 7, 13, 14, 19, 3]:  # forward, across shards, and one step back
        image, label, meta = source[index]
        assert label == expected[index]["cls"] and meta == expected[index]["json"]
        assert np.array_equal(image, decoded_image(expected[index]))


def test_indexed_source_is_safe_to_read_from_two_threads(photo_shards):
    from betonbuild.sources.webdataset import WebDatasetSource, shard_list

    spec = wds_spec("s/p-*.tar")
    Path("shards.json").write_text(json.dumps(shard_list(spec, "cache.json")))
    source = WebDatasetSource(spec, "shards.json")
    expected = [s["cls"] for s in photo_samples()]

    def labels(indices):
        return [source[i][1] for i in indices]

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so the interleaving shows on a small shard
    try:
        for _ in range(5):
            with ThreadPoolExecutor(2) as pool:
                got = [x for part in pool.map(labels, [range(0, 7), range(7, 14), range(14, 20)]) for x in part]
            assert got == expected
    finally:
        sys.setswitchinterval(interval)


# -- the tar scan: tarfile's member names, webdataset's samples, and no quiet end ---------------


def _tarfile_members(path) -> list[tuple[str, bool, int]]:
    """What webdataset reads: tarfile in stream mode."""
    import tarfile

    with tarfile.open(path, "r|*") as tar:
        return [(m.name, m.isreg(), m.size if m.isreg() else 0) for m in tar]


def _scanned(path) -> list[tuple[str, bool, int]]:
    from betonbuild.sources.webdataset import open_shard, tar_members

    with open_shard(str(path)) as (fh, size):
        return [(name, regular, size if regular else 0) for name, regular, size in tar_members(fh, size)]


LONG_DIR = "d" * 90 + "/" + "e" * 70  # names past 100 bytes: a ustar prefix, a GNU 'L' or a PAX path


def _odd_tar(path: Path, fmt: str, compression: str = "") -> Path:
    """Real photo bytes under every kind of name and member tarfile writes in ``fmt``."""
    import tarfile

    jpg = photo_samples()[0]["jpg"]
    files = [
        ("dir.v1/0001.jpg", jpg),
        ("dir.v1/0001.cls", b"3"),  # a dot in a directory
        ("0002.JPG", jpg),
        ("0002.Seg.PNG", jpg),  # upper case, two extensions
        ("__meta__", b"{}"),
        ("__x__/0003.cls", b"1"),  # webdataset's meta members: skipped
        ("README", b"no extension: no sample key"),
        (f"{LONG_DIR}/0004.jpg", jpg),
        (f"{LONG_DIR}/0004.cls", b"4"),
        ("café/0005.jpg", jpg),
        ("0006.txt", b""),  # a non-ASCII name, an empty member
    ]
    pax = {"comment": "a global header"} if fmt == "pax" else None
    formats = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, f"w:{compression}", format=formats[fmt], pax_headers=pax) as tar:
        directory = tarfile.TarInfo("dir.v1")
        directory.type = tarfile.DIRTYPE
        tar.addfile(directory)
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1700000000.5 if fmt == "pax" else 1700000000
            tar.addfile(info, io.BytesIO(data))
        for name, kind in (("0007.jpg", tarfile.SYMTYPE), ("0008.jpg", tarfile.LNKTYPE)):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = kind, "0002.JPG"
            tar.addfile(link)
    return path


@pytest.mark.parametrize("compression", ["", "gz", "bz2", "xz"])
@pytest.mark.parametrize("fmt", ["ustar", "gnu", "pax"])
def test_tar_scan_names_every_member_as_tarfile_does(tmp_path, fmt, compression):
    path = _odd_tar(tmp_path / f"odd.tar{'.' + compression if compression else ''}", fmt, compression)
    scanned = _scanned(path)
    assert scanned == _tarfile_members(path)
    names = [(name, regular) for name, regular, _ in scanned]
    assert (f"{LONG_DIR}/0004.jpg", True) in names and ("café/0005.jpg", True) in names
    assert ("dir.v1", False) in names and ("0007.jpg", False) in names


@pytest.mark.parametrize("fmt", ["ustar", "gnu", "pax"])
def test_count_shard_groups_samples_as_webdataset_does(tmp_path, monkeypatch, fmt):
    """The count and the keys of what webdataset itself yields from the same shard."""
    from betonbuild.sources.webdataset import count_shard

    monkeypatch.chdir(tmp_path)
    path = _odd_tar(tmp_path / "odd.tar", fmt)
    samples = list(
        wds.WebDataset("odd.tar", shardshuffle=False, empty_check=False, nodesplitter=None, workersplitter=None)
    )
    keys = sorted({k for s in samples for k in s if not k.startswith("__")})
    assert [s["__key__"] for s in samples] == ["dir.v1/0001", "0002", f"{LONG_DIR}/0004", "café/0005", "0006"]
    spec = wds_spec(path.name, keys=None, pipeline="mod:fn")  # a pipeline: no key is required
    payload_bytes = [sum(len(v) for k, v in s.items() if not k.startswith("__")) for s in samples]
    assert count_shard(spec, path.name) == {
        "samples": len(samples),
        "keys": keys,
        "largest": [[i, n] for i, n in enumerate(payload_bytes)],
    }
    assert keys == ["cls", "jpg", "seg.png", "txt"]


def _photo_shard_bytes(tmp_path: Path) -> tuple[bytes, list[tuple[str, int, int]]]:
    shard = write_shard(tmp_path / "good.tar", photo_samples()[:5])
    return shard.read_bytes(), _tar_offsets(shard)


def _damaged(data: bytes, members, how: str) -> tuple[bytes, list[str]]:
    """A PAX shard of 5 samples damaged ``how``, and what count_shard's message must say.

    Each member is a PAX header block, its records block, then the member's header and data."""
    start = {name: first for name, first, _ in members}
    stop = {name: end for name, _, end in members}
    last = stop["china_0.json"] + (-stop["china_0.json"]) % 512  # the end of the last member's padded data
    if how == "cut_inside_payload":
        return data[: stop["astronaut_1.jpg"] - 700], [
            "truncated at byte",
            "inside member 'astronaut_1.jpg'",
            "(sample key astronaut_1)",
            "unexpected end of data",
        ]
    if how == "cut_between_samples":
        return data[: start["chelsea_0.cls"]], [
            "truncated at byte",
            "after member 'astronaut_1.json'",
            "(sample key astronaut_1)",
        ]
    if how == "cut_inside_a_header":
        return data[: start["chelsea_0.cls"] + 300], ["truncated", "after member 'astronaut_1.json'"]
    if how == "no_end_blocks":
        return data[:last], ["truncated", "after member 'china_0.json' (sample key china_0)"]
    if how == "one_end_block":
        return data[: last + 512], ["truncated", "the second end-of-archive block is missing"]
    damaged = bytearray(data)
    if how == "bad_checksum":
        header = start["chelsea_0.jpg"] + 1024
        damaged[header + 5] ^= 0x01  # one bit of the member's name
        return bytes(damaged), [
            f"corrupt at byte {header}",
            "bad checksum",
            "after member 'chelsea_0.cls' (sample key chelsea_0)",
        ]
    if how == "garbage_header":
        header = start["chelsea_0.cls"]
        damaged[header : header + 512] = bytes(range(256)) * 2
        return bytes(damaged), [f"corrupt at byte {header}", "not a tar header", "after member 'astronaut_1.json'"]
    raise ValueError(how)


DAMAGE = [
    "cut_inside_payload",
    "cut_between_samples",
    "cut_inside_a_header",
    "no_end_blocks",
    "one_end_block",
    "bad_checksum",
    "garbage_header",
]


@pytest.mark.parametrize("how", DAMAGE)
def test_count_shard_refuses_a_damaged_tar_naming_shard_member_and_key(tmp_path, monkeypatch, how):
    from betonbuild.sources.webdataset import count_shard

    monkeypatch.chdir(tmp_path)
    data, members = _photo_shard_bytes(tmp_path)
    damaged, expect = _damaged(data, members, how)
    Path("bad.tar").write_bytes(damaged)
    started = time.monotonic()
    with pytest.raises(SourceError) as info:
        count_shard(wds_spec("bad.tar"), "bad.tar")
    message = str(info.value)
    assert message.startswith("dataset 'd': shard bad.tar is "), message
    for part in expect:
        assert part in message, f"{part!r} not in {message!r}"
    assert time.monotonic() - started < 2


@pytest.mark.parametrize(
    "how, members_read", [("cut_between_samples", 6), ("garbage_header", 6), ("no_end_blocks", 15)]
)
def test_tarfile_alone_reads_these_shards_without_an_error(tmp_path, how, members_read):
    """Why the scan requires the end-of-archive blocks: tarfile (so webdataset) just stops early."""
    data, members = _photo_shard_bytes(tmp_path)
    path = tmp_path / "bad.tar"
    path.write_bytes(_damaged(data, members, how)[0])
    assert [(name, regular) for name, regular, _ in _tarfile_members(path)] == [
        (name, True) for name, _, _ in members[:members_read]
    ]


def test_count_shard_reads_compressed_shards_and_refuses_a_cut_one(tmp_path, monkeypatch):
    import gzip

    from betonbuild.sources.webdataset import count_shard

    monkeypatch.chdir(tmp_path)
    data, members = _photo_shard_bytes(tmp_path)
    Path("good.tar.gz").write_bytes(gzip.compress(data))
    assert count_shard(wds_spec("good.tar.gz"), "good.tar.gz") == count_shard(wds_spec("good.tar"), "good.tar")
    Path("cut_tar.tar.gz").write_bytes(gzip.compress(_damaged(data, members, "cut_inside_payload")[0]))
    with pytest.raises(
        SourceError,
        match=r"shard cut_tar\.tar\.gz is truncated at byte \d+, inside member "
        r"'astronaut_1\.jpg' \(sample key astronaut_1\)",
    ):
        count_shard(wds_spec("cut_tar.tar.gz"), "cut_tar.tar.gz")
    compressed = gzip.compress(data)
    Path("cut_gzip.tar.gz").write_bytes(compressed[: len(compressed) // 2])
    with pytest.raises(SourceError, match=r"shard cut_gzip\.tar\.gz is not a readable tar file .*EOFError"):
        count_shard(wds_spec("cut_gzip.tar.gz"), "cut_gzip.tar.gz")


def test_count_shard_refuses_a_gnu_sparse_member(tmp_path, monkeypatch):
    from betonbuild.sources.webdataset import count_shard

    monkeypatch.chdir(tmp_path)
    data, members = _photo_shard_bytes(tmp_path)
    damaged = bytearray(data)
    header = next(start for name, start, _ in members if name == "astronaut_1.jpg") + 1024  # after its PAX header
    damaged[header + 156 : header + 157] = b"S"
    checksum = 256 + sum(damaged[header : header + 148]) + sum(damaged[header + 156 : header + 512])
    damaged[header + 148 : header + 156] = b"%06o\0 " % checksum
    Path("sparse.tar").write_bytes(bytes(damaged))
    with pytest.raises(SourceError, match="GNU sparse file, which betonbuild does not read"):
        count_shard(wds_spec("sparse.tar"), "sparse.tar")


# -- decoding: plain JPEGs through cv2, the same arrays as webdataset's rgb8 ----------------------


def _encoded(image: np.ndarray, fmt: str = "JPEG", mode: str | None = None, **options) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    picture = Image.fromarray(image)
    (picture.convert(mode) if mode else picture).save(out, format=fmt, **options)
    return out.getvalue()


def _with_orientation(image: np.ndarray) -> bytes:
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees to display": rgb8 does not apply it
    return _encoded(image, quality=90, exif=exif.tobytes())


def _cv2_jpeg(image: np.ndarray, *flags: int) -> bytes:
    import cv2

    return cv2.imencode(".jpg", np.ascontiguousarray(image[..., ::-1]), [cv2.IMWRITE_JPEG_QUALITY, 90, *flags])[
        1
    ].tobytes()


_IMAGE_CACHE: dict[str, tuple[str, bytes, bool]] = {}


def image_payloads() -> dict[str, tuple[str, bytes, bool]]:
    """name -> (extension, payload, whether cv2 decodes it): real photos stored the ways a shard may
    hold them; crops of 90x70, not a multiple of the 16-pixel MCU."""
    if _IMAGE_CACHE:
        return _IMAGE_CACHE
    import cv2
    import skimage.data

    from betonbuild.demo import colour_photos

    out = _IMAGE_CACHE
    for name, photo in sorted(colour_photos().items()):
        crop = np.ascontiguousarray(photo[37:127, 51:121, :3])
        out[f"{name}-420"] = ("jpg", _encoded(crop, quality=90), True)
        out[f"{name}-444"] = ("jpg", _encoded(crop, quality=75, subsampling=0), True)
        out[f"{name}-422"] = ("jpeg", _encoded(crop, quality=95, subsampling=1), True)
        out[f"{name}-progressive"] = ("jpg", _encoded(crop, quality=85, progressive=True), True)
        out[f"{name}-gray"] = ("jpg", _encoded(crop, mode="L", quality=90), True)
        out[f"{name}-exif-rotated"] = ("jpg", _with_orientation(crop), True)
        out[f"{name}-cv2-restarts"] = ("jpg", _cv2_jpeg(crop, cv2.IMWRITE_JPEG_RST_INTERVAL, 3), True)
        out[f"{name}-cmyk"] = ("jpg", _encoded(crop, mode="CMYK", quality=90), False)
        out[f"{name}-png"] = ("png", _encoded(crop, fmt="PNG"), False)
        out[f"{name}-png-as-jpg"] = ("jpg", _encoded(crop, fmt="PNG"), False)  # PIL goes by content
    for name in ("camera", "coins", "moon"):
        gray = np.ascontiguousarray(getattr(skimage.data, name)()[11:101, 23:93])
        out[f"{name}-gray"] = ("jpg", _encoded(gray, quality=90), True)
        out[f"{name}-gray-progressive"] = ("jpg", _encoded(gray, quality=80, progressive=True), True)
        out[f"{name}-png-gray"] = ("png", _encoded(gray, fmt="PNG"), False)
        out[f"{name}-png-16bit"] = ("png", _encoded(gray.astype(np.uint16) * 257, fmt="PNG"), False)
        out[f"{name}-png-palette"] = ("png", _encoded(np.stack([gray] * 3, -1), fmt="PNG", mode="P"), False)
        out[f"{name}-png-rgba"] = ("png", _encoded(np.stack([gray] * 3, -1), fmt="PNG", mode="RGBA"), False)
    return out


def _rgb8(ext: str, payload: bytes):
    """webdataset's own rgb8 decode."""
    return wds.autodecode.Decoder([wds.autodecode.imagehandler("rgb8")]).decode1(ext, payload)


@pytest.fixture
def image_source(tmp_path, monkeypatch):
    """A WebDatasetSource over one shard of all image_payloads(), with cv2's calls counted."""
    import betonbuild.sources.webdataset as wds_module

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(wds_module, "JPEG_KINDS", {})
    calls: list[int] = []
    real = wds_module.cv2_rgb8
    monkeypatch.setattr(wds_module, "cv2_rgb8", lambda data: calls.append(1) or real(data))
    samples = [
        {"__key__": f"{i:03d}_{name}", ext: payload}
        for i, (name, (ext, payload, _)) in enumerate(image_payloads().items())
    ]
    write_shard(tmp_path / "images.tar", samples)
    spec = wds_spec("images.tar", keys={"image": "jpg;jpeg;png"}, fields={"image": {"type": "rgb_image"}})
    Path("shards.json").write_text(json.dumps(wds_module.shard_list(spec, "cache.json")))
    return wds_module.WebDatasetSource(spec, "shards.json"), calls


def test_jpeg_kind_admits_plain_jpegs_only():
    from betonbuild.sources.webdataset import jpeg_kind

    for name, (_, payload, plain) in image_payloads().items():
        assert (jpeg_kind(payload) is not None) == plain, name
    jpeg = image_payloads()["astronaut-420"][1]
    for damaged in (jpeg[:-1], jpeg[:-2], jpeg + b"\0", jpeg[:400] + b"\xff\xd9" + jpeg[400:], jpeg[:2] + jpeg[4:]):
        assert jpeg_kind(damaged) is None


def test_rgb8_decode_gives_webdataset_s_arrays_through_cv2_for_plain_jpegs(image_source):
    import betonbuild.sources.webdataset as wds_module

    source, calls = image_source
    payloads = list(image_payloads().items())
    assert len(source) == len(payloads)
    for index, (name, (ext, payload, _plain)) in enumerate(payloads):
        (image,) = source[index]
        expected = _rgb8(ext, payload)
        assert image.dtype == expected.dtype == np.uint8 and image.shape == expected.shape, name
        assert image.shape[2] == 3 and np.array_equal(image, expected), name
    assert len(calls) == sum(plain for _, (_, _, plain) in payloads)  # cv2 decoded every plain JPEG
    assert len(wds_module.JPEG_KINDS) >= 5 and all(wds_module.JPEG_KINDS.values()), wds_module.JPEG_KINDS


def test_a_cv2_that_disagrees_with_pil_leaves_that_kind_to_pil(image_source, monkeypatch):
    import betonbuild.sources.webdataset as wds_module

    source, _ = image_source
    real = wds_module.cv2_rgb8
    monkeypatch.setattr(wds_module, "cv2_rgb8", lambda data: real(data) ^ np.uint8(1))  # another libjpeg
    for index, (name, (ext, payload, _)) in enumerate(image_payloads().items()):
        assert np.array_equal(source[index][0], _rgb8(ext, payload)), name
    assert wds_module.JPEG_KINDS and not any(wds_module.JPEG_KINDS.values())


@pytest.mark.filterwarnings("ignore:Tag data larger than file")  # PIL, reading a damaged EXIF block
def test_a_damaged_jpeg_decodes_or_fails_exactly_as_with_webdataset(image_source):
    """Seeded byte damage to real JPEGs: where PIL raises, cv2 alone often returns pixels."""
    from betonbuild.sources.webdataset import cv2_rgb8

    source, _ = image_source
    rng = np.random.default_rng(7)
    plain = [payload for ext, payload, fast in image_payloads().values() if fast]
    outcomes, cv2_alone_would_differ = {}, 0
    for trial in range(400):
        damaged = bytearray(plain[trial % len(plain)])
        for _ in range(int(rng.integers(1, 4))):
            damaged[int(rng.integers(2, len(damaged)))] = 0xFF if rng.random() < 0.3 else int(rng.integers(256))
        if trial % 10 == 0:  # cut, with or without an end marker
            damaged = damaged[: int(rng.integers(2, len(damaged)))] + (b"\xff\xd9" if trial % 20 else b"")
        damaged = bytes(damaged)
        try:
            expected = _rgb8("jpg", damaged)
        except Exception as exc:  # noqa: BLE001 - whatever PIL raises, the source must raise too
            with pytest.raises(type(exc)):
                source.decode1("jpg", damaged)
            cv2_alone_would_differ += cv2_rgb8(damaged) is not None
            outcomes["fails"] = outcomes.get("fails", 0) + 1
            continue
        assert np.array_equal(source.decode1("jpg", damaged), expected), trial
        outcomes["decodes"] = outcomes.get("decodes", 0) + 1
    assert outcomes.get("fails", 0) > 20 and outcomes.get("decodes", 0) > 20, outcomes
    assert cv2_alone_would_differ > 0, outcomes


FAST_DECODE_DRIVER = textwrap.dedent(
    '''
    """Writes the same shards twice: rgb8 JPEGs through cv2 (the default), then all through PIL."""
    import json, os
    from pathlib import Path

    import betonbuild.sources.webdataset as W
    from betonbuild.config.load import load_config
    from betonbuild.workflow.stages import build, make_shard_list, make_source_manifest

    spec = load_config({"datasets": {"images": json.loads(Path("entry.json").read_text())}}).datasets["images"]
    make_shard_list(spec, "results/shards.json")
    make_source_manifest(spec, "results/source.json")
    real = W.cv2_rgb8

    def counted(data):  # runs in the writer's worker processes: a file per process counts the calls
        with open(f"cv2-calls-{os.getpid()}", "a") as fh:
            fh.write("x")
        return real(data)

    W.cv2_rgb8 = counted
    build(spec, "results/source.json", "results/cv2.beton", "results/cv2.json", threads=2)
    W.jpeg_kind = lambda data: None  # every image through webdataset's decoder, as before cv2
    build(spec, "results/source.json", "results/pil.beton", "results/pil.json", threads=2)
    '''
)


def test_the_written_beton_is_the_same_with_cv2_decoding(tmp_path):
    from betonbuild.beton.format import BetonFile

    payloads = list(image_payloads().values())
    samples = [{"__key__": f"s{i:03d}", ext: payload, "cls": i} for i, (ext, payload, _) in enumerate(payloads)]
    half = len(samples) // 2
    write_shard(tmp_path / "images-0.tar", samples[:half])
    write_shard(tmp_path / "images-1.tar", samples[half:])
    entry = {
        "source": {
            "kind": "webdataset",
            "shards": "images-{0..1}.tar",
            "keys": {"image": "jpg;jpeg;png", "label": "cls"},
        },
        "fields": {"image": {"type": "rgb_image", "write_mode": "jpg"}, "label": {"type": "int"}},
    }
    (tmp_path / "entry.json").write_text(json.dumps(entry))
    (tmp_path / "results").mkdir()
    proc = subprocess.run([PYTHON, "-c", FAST_DECODE_DRIVER], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]

    cv2_calls = sum(len(p.read_text()) for p in tmp_path.glob("cv2-calls-*"))
    assert cv2_calls == sum(plain for _, _, plain in payloads)  # each plain JPEG once, through cv2
    fast, reference = BetonFile(tmp_path / "results/cv2.beton"), BetonFile(tmp_path / "results/pil.beton")
    assert fast.num_samples == reference.num_samples == len(samples)
    assert fast.metadata["label"].tolist() == reference.metadata["label"].tolist() == list(range(len(samples)))
    for row in range(len(samples)):
        assert np.array_equal(fast.variable_payload("image", row), reference.variable_payload("image", row)), row


# -- config checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shards",
    [
        "http://example.org/train-{0000..0015}.tar",
        "https://example.org/train-0000.tar",
        "s3://bucket/train-0000.tar",
        "gs://bucket/train-*.tar",
        "pipe:curl -s https://example.org/train-0000.tar",
        "file:///data/train-0000.tar",
        ["data/train-0000.tar", "pipe:cat data/train-0001.tar"],
    ],
)
def test_urls_are_refused_at_config_time(shards):
    with pytest.raises(ConfigError) as info:
        wds_spec(shards)
    message = str(info.value)
    assert message.startswith("datasets.d.source.shards:"), message
    assert "URL" in message and "local" in message, message


@pytest.mark.parametrize("writer", [{"shuffle": True}, {"indices": [0, 1, 2]}, {"indices": "0:10"}])
def test_shuffle_and_indices_are_refused(writer):
    entry = {
        "source": {"kind": "webdataset", "shards": "x.tar"},
        "fields": {"label": {"type": "int"}},
        "writer": writer,
    }
    with pytest.raises(ConfigError) as info:
        load_config({"datasets": {"d": entry}})
    assert str(info.value).startswith("datasets.d.writer:") and "shard order" in str(info.value)


def test_keys_must_name_fields_and_local_paths_are_accepted():
    with pytest.raises(ConfigError, match=r"datasets\.d\.source\.keys: names \['lable'\]"):
        wds_spec("x.tar", keys={"image": "jpg", "lable": "cls"})
    spec = wds_spec(["data/a.tar", "/abs/b-{0..3}.tar", "rel/c-*.tar"])
    assert spec.source["decode"] == "rgb8" and spec.source["pipeline"] is None


# ---------------------------------------------------------------------------------------------
# The workflow: one project built once by real snakemake
# ---------------------------------------------------------------------------------------------

PIPELINE_MODULE = '''
"""Written by tests/workflow/test_webdataset.py: the pipelines of its webdataset datasets."""


def digits(dataset):
    return dataset.decode().to_tuple("npy", "cls").map_tuple(None, lambda c: c + 100)


def drop_coffee(dataset):
    dataset = dataset.select(lambda s: not s["__key__"].startswith("coffee"))
    return dataset.decode("rgb8").to_tuple("jpg;png", "cls", "json")
'''


def project_datasets() -> dict:
    return {
        "photos": photo_dataset("photos/p-*.tar"),
        "digits": {  # through the user's pipeline (module:function), not keys/decode
            "source": {"kind": "webdataset", "shards": "digits/d-{000000..000002}.tar", "pipeline": "wdspipe:digits"},
            "fields": {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}},
            "smoke": {"samples": 4},
        },
    }


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("wds_project")
    photos = photo_samples()
    for i in range(3):
        write_shard(workdir / f"photos/p-{i:04d}.tar", photos[i * 7 : (i + 1) * 7])
    (workdir / "digits").mkdir()
    with wds.ShardWriter(str(workdir / "digits/d-%06d.tar"), maxcount=25, verbose=0) as sink:
        for sample in digit_samples(60):
            sink.write(sample)
    (workdir / "wdspipe.py").write_text(PIPELINE_MODULE)
    write_config(workdir, project_datasets())
    started = time.monotonic()
    result = run_snakemake(workdir, "all")
    return {"workdir": workdir, "result": result, "seconds": time.monotonic() - started}


def _beton(workdir: Path, name: str):
    from betonbuild.beton.format import BetonFile

    return BetonFile(workdir / "results" / name / f"{name}.beton")


def test_photo_shards_beton_equals_the_samples_in_shard_order(project):
    from betonbuild.beton.payloads import decode_image, decode_json

    beton = _beton(project["workdir"], "photos")
    expected = photo_samples()
    assert beton.num_samples == len(expected) == 20
    assert beton.metadata["label"].tolist() == [s["cls"] for s in expected]
    for row, sample in enumerate(expected):
        assert decode_json(beton.variable_payload("meta", row)) == sample["json"]
        image, source = decode_image(beton, "image", row), decoded_image(sample)
        assert image.shape == source.shape == (64, 64, 3)
        error = np.abs(image.astype(np.int16) - source.astype(np.int16)).mean()
        assert error < JPEG_TOLERANCE, f"row {row} ({sample['__key__']}): mean abs error {error:.2f}"


def test_pipeline_dataset_holds_what_the_pipeline_yields_exactly(project):
    """The digits' pipeline decodes .npy and adds 100 to the class; read back with ffcv's own Reader too."""
    from ffcv.reader import Reader

    beton = _beton(project["workdir"], "digits")
    expected = digit_samples(60)
    assert np.array_equal(beton.ndarray_column("image"), np.stack([s["npy"] for s in expected]))
    assert beton.metadata["label"].tolist() == [s["cls"] + 100 for s in expected]
    reader = Reader(str(project["workdir"] / "results/digits/digits.beton"))
    assert reader.num_samples == 60 and reader.field_names == ["image", "label"]
    assert reader.metadata["f1"].tolist() == [s["cls"] + 100 for s in expected]


@pytest.mark.parametrize("name, samples", [("photos", 20), ("digits", 60)])
def test_reports_are_ok(project, name, samples):
    results = project["workdir"] / "results" / name
    for report_name in ("smoke.verify.json", f"{name}.verify.json"):
        report = json.loads((results / report_name).read_text())
        assert report["ok"], report.get("worst") or report
    assert report["num_samples"] == {"expected": samples, "found": samples}


def test_shard_list_is_derived_per_shard(project):
    listing = json.loads((project["workdir"] / "results/digits/shards.json").read_text())
    assert [(e["path"], e["samples"], e["keys"]) for e in listing["shards"]] == [
        ("digits/d-000000.tar", 25, ["cls", "npy"]),
        ("digits/d-000001.tar", 25, ["cls", "npy"]),
        ("digits/d-000002.tar", 10, ["cls", "npy"]),
    ]
    assert all(len(e["sha256"]) == 64 and e["size"] > 0 and e["mtime_ns"] > 0 for e in listing["shards"])
    # each shard's largest samples by payload bytes (for the pre-flight), here all the same size
    assert [len(e["largest"]) for e in listing["shards"]] == [8, 8, 8]
    source = json.loads((project["workdir"] / "results/digits/source.json").read_text())
    assert source["length"] == 60


def test_progress_is_counted_in_samples(project):
    log = (project["workdir"] / "logs/write/photos.log").read_text()
    assert "photos (full): 20/20 samples" in log, log[-2000:]


def test_nothing_changed_runs_nothing(project):
    assert ran(run_snakemake(project["workdir"], "all")) == {}


def test_editing_the_pipeline_module_rebuilds_only_the_dataset_that_uses_it(project):
    workdir = project["workdir"]
    (workdir / "wdspipe.py").write_text(PIPELINE_MODULE + "\n# the pipeline's module changed\n")
    jobs = ran(run_snakemake(workdir, "all"))
    assert set(jobs) == {"digits"}, jobs
    assert {"source_manifest", "smoke", "write", "verify"} <= jobs["digits"], jobs


def test_adding_changing_and_removing_shards_rebuilds_only_that_dataset_and_recounts_only_them(project):
    """Runs last in this module: it edits the project's shards."""
    workdir = project["workdir"]
    cache_path = workdir / "results/photos/.shards-cache.json"
    cache = json.loads(cache_path.read_text())
    assert sorted(cache) == [f"photos/p-{i:04d}.tar" for i in range(3)]
    for entry in cache.values():
        entry["probe"] = "kept from the cache"  # survives into shards.json only if NOT recounted
    cache_path.write_text(json.dumps(cache))

    photos = photo_samples()
    write_shard(workdir / "photos/p-0003.tar", photos[:3])  # added
    write_shard(workdir / "photos/p-0002.tar", photos[14:19])  # changed: 6 -> 5 samples
    (workdir / "photos/p-0001.tar").unlink()  # removed
    result = run_snakemake(workdir, "all")
    jobs = ran(result)
    assert set(jobs) == {"photos"}, jobs
    assert {"shard_list", "source_manifest", "smoke", "write", "verify"} <= jobs["photos"], jobs

    listing = json.loads((workdir / "results/photos/shards.json").read_text())
    assert [(e["path"], e["samples"], "probe" in e) for e in listing["shards"]] == [
        ("photos/p-0000.tar", 7, True),  # from the cache
        ("photos/p-0002.tar", 5, False),  # recounted
        ("photos/p-0003.tar", 3, False),  # counted
    ]
    expected = photos[0:7] + photos[14:19] + photos[:3]
    assert _beton(workdir, "photos").metadata["label"].tolist() == [s["cls"] for s in expected]
    report = json.loads((workdir / "results/photos/photos.verify.json").read_text())
    assert report["ok"] and report["num_samples"]["found"] == 15


# ---------------------------------------------------------------------------------------------
# Bad shards: `betonbuild write` per case, then one snakemake --keep-going over them all
# ---------------------------------------------------------------------------------------------


def _tar_offsets(path: Path) -> list[tuple[str, int, int]]:
    import tarfile

    with tarfile.open(path) as tar:
        return [(m.name, m.offset, m.offset_data + m.size) for m in tar]


def _bad_cases(workdir: Path) -> dict[str, dict]:
    """name -> {dataset entry, what the message must contain, xfail reason}; writes the shards."""
    photos = photo_samples()
    good = write_shard(workdir / "good.tar", photos[:5])
    data = good.read_bytes()
    members = _tar_offsets(good)
    cases: dict[str, dict] = {}

    def case(name, shard_bytes=None, samples=None, expect=(), shards=None, xfail=None):
        path = workdir / f"{name}.tar"
        if samples is not None:
            write_shard(path, samples)
        elif shard_bytes is not None:
            path.write_bytes(shard_bytes)
        cases[name] = {
            "entry": photo_dataset(shards or ["good.tar", f"{name}.tar"]),
            "expect": [f"{name}.tar", *expect],
            "xfail": xfail,
        }

    case(
        "corrupt",
        shard_bytes=np.random.default_rng(0).integers(0, 256, 30000, dtype=np.uint8).tobytes(),
        expect=["not a readable tar file"],
    )
    jpg_end = next(end for name, _, end in members if name == f"{photos[2]['__key__']}.jpg")
    case("truncated", shard_bytes=data[: jpg_end - 1000], expect=["truncated", "unexpected end of data"])
    case("empty", samples=[], expect=["holds no sample"])
    case("zero_bytes", shard_bytes=b"", expect=["not a readable tar file"])
    case("missing", expect=["does not exist"])
    missing_key = [dict(s) for s in photos[:4]]
    del missing_key[2]["cls"]
    case("missing_key", samples=missing_key, expect=[f"key {photos[2]['__key__']}", "field 'label'", "cls"])
    case("duplicate_key", samples=photos[:3] + [photos[1]], expect=[repr(photos[1]["__key__"]), "twice"])
    undecodable = [dict(s) for s in photos[:4]]
    undecodable[1]["jpg"] = b"\xff\xd8\xff\xe0 this is not really a JPEG" * 20
    case("undecodable", samples=undecodable, expect=[f"key {photos[1]['__key__']}", "field 'image'", "'jpg'"])
    # A tar cut exactly between two samples (or inside a header block) reads as a shorter, valid tar.
    third_sample = next(start for name, start, _ in members if name.startswith(photos[3]["__key__"]))
    case("truncated_at_sample", shard_bytes=data[:third_sample], expect=["truncated"])
    scrambled = bytearray(data)
    scrambled[third_sample : third_sample + 512] = (
        np.random.default_rng(1).integers(0, 256, 512, dtype=np.uint8).tobytes()
    )
    case("corrupt_middle", shard_bytes=bytes(scrambled), expect=["corrupt"])
    return cases


IN_PROCESS = {"corrupt", "truncated", "empty", "zero_bytes", "missing", "missing_key", "duplicate_key"}


def _run_case_in_process(workdir: Path, name: str) -> dict:
    """`betonbuild write` in this process, for a case that must fail in the shard list (before ffcv)."""
    import contextlib

    from betonbuild.cli import main

    target = workdir / "results" / name / f"{name}.beton"
    stderr = io.StringIO()
    started = time.monotonic()
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        with contextlib.redirect_stderr(stderr):
            rc = main(
                ["write", "--config", "config.yaml", "--dataset", name, "--output", str(target), "--workers", "2"]
            )
    except Exception:  # noqa: BLE001 - reported like a subprocess's traceback
        import traceback

        rc, stderr = 1, io.StringIO(stderr.getvalue() + traceback.format_exc())
    finally:
        os.chdir(cwd)
    return {"rc": rc, "stderr": stderr.getvalue(), "seconds": time.monotonic() - started}


def _run_case(workdir: Path, name: str) -> dict:
    target = workdir / "results" / name / f"{name}.beton"
    cmd = [BETONBUILD, "write", "--config", "config.yaml", "--dataset", name, "--output", str(target), "--workers", "2"]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=CASE_LIMIT)
        rc, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stderr = (
            None,
            (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr),
        )
    return {"rc": rc, "stderr": stderr, "seconds": time.monotonic() - started}


@pytest.fixture(scope="module")
def bad_shards(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("wds_bad")
    cases = _bad_cases(workdir)
    write_config(workdir, {name: c["entry"] for name, c in cases.items()})
    runs = {name: _run_case_in_process(workdir, name) for name in cases if name in IN_PROCESS}
    with ThreadPoolExecutor(2) as pool:
        others = [name for name in cases if name not in IN_PROCESS]
        runs.update(zip(others, pool.map(lambda n: _run_case(workdir, n), others)))
    failure = workdir / "results/undecodable/failure"
    saved = {"record": json.loads((failure / "failure.json").read_text()) if failure.is_dir() else None}
    if failure.is_dir():
        saved["repro"] = subprocess.run(
            [BETONBUILD, "repro", str(failure)], cwd=workdir, capture_output=True, text=True, timeout=CASE_LIMIT
        )
    for name in cases:  # what the `betonbuild write` runs left (failure records), before snakemake runs
        shutil.rmtree(workdir / "results" / name, ignore_errors=True)
    return workdir, cases, runs, saved


def _leftovers(directory: Path, name: str) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if p.name.startswith((f"{name}.beton", f".{name}.beton")))


BAD_CASES = [
    "corrupt",
    "truncated",
    "empty",
    "zero_bytes",
    "missing",
    "missing_key",
    "duplicate_key",
    "undecodable",
    "truncated_at_sample",
    "corrupt_middle",
]


@pytest.mark.parametrize("name", BAD_CASES)
def test_bad_shard_fails_fast_naming_shard_and_key(bad_shards, name, request):
    workdir, cases, runs, _ = bad_shards
    case, run = cases[name], runs[name]
    if case["xfail"]:
        request.applymarker(pytest.mark.xfail(strict=True, reason=case["xfail"]))
    assert run["rc"] is not None, f"{name}: no exit within {CASE_LIMIT} s (a hang)"
    assert run["seconds"] < 30, f"{name} took {run['seconds']:.1f} s"
    stderr = run["stderr"]
    assert run["rc"] == 1, f"{name}: exit {run['rc']}\n{stderr[-3000:]}"
    assert "Traceback" not in stderr, stderr[-3000:]
    line = next((ln for ln in stderr.splitlines() if ln.startswith("betonbuild error:")), "")
    assert f"dataset '{name}'" in line, stderr[-3000:]
    for part in case["expect"]:
        assert part in line, f"{part!r} not in {line!r}"
    assert _leftovers(workdir / "results" / name, name) == []


def test_an_undecodable_payload_is_saved_as_a_failure_record(bad_shards):
    workdir, _, runs, saved = bad_shards
    record = saved["record"]
    assert record, "no results/undecodable/failure/failure.json"
    assert record["field"] == "image" and record["index"] == 6  # 5 samples of good.tar, then its 2nd
    assert "(shard undecodable.tar, key astronaut_1): cannot decode its 'jpg' member" in record["message"]
    assert "replay it with: betonbuild repro" in runs["undecodable"]["stderr"]


def test_betonbuild_repro_replays_an_undecodable_payload(bad_shards):
    _, _, _, saved = bad_shards
    repro = saved["repro"]
    assert repro.returncode == 1, repro.stderr[-3000:]
    assert f"reproduced: {saved['record']['message']}" in repro.stderr, repro.stderr[-3000:]


def test_snakemake_keep_going_reports_every_bad_shard_and_writes_nothing(bad_shards):
    """The cases above through the workflow (a missing shard is Snakemake's missing input: next test)."""
    workdir, all_cases, _, _ = bad_shards
    cases = {name: c for name, c in all_cases.items() if not c["xfail"] and name != "missing"}
    write_config(workdir, {name: c["entry"] for name, c in cases.items()})
    started = time.monotonic()
    result = run_snakemake(workdir, "all", "--keep-going", check=False)
    seconds = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert seconds < 120, f"{seconds:.0f} s"
    for name, case in cases.items():
        line = next((ln for ln in output.splitlines() if ln.startswith(f"betonbuild error: dataset '{name}'")), "")
        assert line, f"{name}: no error line in the console output\n{output[-4000:]}"
        for part in case["expect"]:
            assert part in line, f"{part!r} not in {line!r}"
        assert _leftovers(workdir / "results" / name, name) == [], name
    assert (workdir / "results/undecodable/failure/failure.json").is_file()  # the smoke write caught it


def test_snakemake_names_a_missing_shard_before_any_job_runs(bad_shards):
    workdir, cases, _, _ = bad_shards
    write_config(workdir, {"missing": cases["missing"]["entry"]})
    result = run_snakemake(workdir, "-n", "all", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "MissingInputException" in output and "missing.tar" in output, output[-3000:]


# ---------------------------------------------------------------------------------------------
# A shard changed between its shard list and the write; a pipeline that drops samples
# ---------------------------------------------------------------------------------------------

DRIVER = textwrap.dedent(
    '''
    """Runs the stages by hand: shard list + manifest, then the shard changes, then the write."""
    import json, os, shutil, sys, time
    from pathlib import Path

    sys.path.insert(0, os.getcwd())
    import webdataset as wds
    from betonbuild.errors import BetonbuildError
    from betonbuild.config.load import load_config
    from betonbuild.workflow.stages import build, make_shard_list, make_source_manifest

    scenarios = json.loads(Path("scenarios.json").read_text())
    samples = {}
    for name, scenario in scenarios.items():
        spec = load_config({"datasets": {name: scenario["entry"]}}).datasets[name]
        results = Path("results") / name
        make_shard_list(spec, str(results / "shards.json"))
        make_source_manifest(spec, str(results / "source.json"))
        for path, shard_samples in scenario["rewrite"].items():
            with wds.TarWriter(path) as sink:
                for sample in shard_samples:
                    sink.write({k: (bytes.fromhex(v) if k in ("jpg", "png") else v) for k, v in sample.items()})
        target = results / f"{name}.beton"
        started = time.monotonic()
        try:
            build(spec, str(results / "source.json"), str(target), str(results / "write.json"), threads=2)
            outcome = {"error": None}
        except BetonbuildError as exc:
            outcome = {"error": str(exc), "type": type(exc).__name__}
        outcome.update(seconds=time.monotonic() - started, target_exists=target.exists(),
                       leftovers=sorted(p.name for p in results.iterdir() if ".beton" in p.name))
        print(json.dumps({name: outcome}), flush=True)
    '''
)


def _json_sample(sample: dict) -> dict:
    return {k: (v.hex() if isinstance(v, bytes) else v) for k, v in sample.items()}


@pytest.fixture(scope="module")
def changed_underneath(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("wds_changed")
    photos = photo_samples()
    scenarios = {}
    for name, rewrite in {
        "one_fewer": photos[7:13],  # p-1 listed with 7 samples, has 6 at write time
        "one_more": photos[7:14] + photos[:1],  # 8 at write time
    }.items():
        for i in range(3):
            write_shard(workdir / name / f"p-{i}.tar", photos[i * 7 : (i + 1) * 7])
        entry = photo_dataset(f"{name}/p-{{0..2}}.tar")
        scenarios[name] = {"entry": entry, "rewrite": {f"{name}/p-1.tar": [_json_sample(s) for s in rewrite]}}
    for i in range(3):
        write_shard(workdir / "dropping" / f"p-{i}.tar", photos[i * 7 : (i + 1) * 7])
    scenarios["dropping"] = {
        "entry": {
            "source": {"kind": "webdataset", "shards": "dropping/p-{0..2}.tar", "pipeline": "wdspipe:drop_coffee"},
            "fields": PHOTO_FIELDS,
        },
        "rewrite": {},
    }
    (workdir / "wdspipe.py").write_text(PIPELINE_MODULE)
    (workdir / "scenarios.json").write_text(json.dumps(scenarios))
    (workdir / "driver.py").write_text(DRIVER)
    proc = subprocess.run([PYTHON, "driver.py"], cwd=workdir, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    outcomes = {}
    for line in proc.stdout.splitlines():
        outcomes.update(json.loads(line))
    return workdir, outcomes


def _assert_count_mismatch(outcome: dict, shard: str, expected: int, found: int, index: int) -> None:
    message = outcome["error"]
    assert message, "the write succeeded"
    assert outcome["type"] == "SampleError" and outcome["seconds"] < 30, outcome
    assert f"shard {shard} yields {found} samples, but the shard list counted {expected}" in message, message
    assert message.startswith(f"dataset '{shard.split('/')[0]}', sample index {index} (shard {shard})"), message
    assert not outcome["target_exists"] and outcome["leftovers"] == [], outcome


def test_a_shard_with_one_sample_fewer_than_listed_fails_naming_it_and_both_counts(changed_underneath):
    _, outcomes = changed_underneath
    # p-1 holds samples 7..13; its 7th (index 13) is missing at write time
    _assert_count_mismatch(outcomes["one_fewer"], "one_fewer/p-1.tar", expected=7, found=6, index=13)


def test_a_shard_with_one_sample_more_than_listed_fails_naming_it_and_both_counts_never_overrunning(changed_underneath):
    _, outcomes = changed_underneath
    # detected after p-1's last listed sample (index 13), before anything is written from it into p-2's rows
    _assert_count_mismatch(outcomes["one_more"], "one_more/p-1.tar", expected=7, found=8, index=13)


def test_a_pipeline_that_drops_samples_fails_naming_the_shard_and_counts(changed_underneath):
    """Counts come from tar headers: a pipeline must yield one sample per sample key."""
    _, outcomes = changed_underneath
    # p-0 holds astronaut_0..china_1 and coffee_0, which the pipeline drops (p-1, which starts with coffee_1,
    # fails too, at a larger index: the smallest is reported)
    _assert_count_mismatch(outcomes["dropping"], "dropping/p-0.tar", expected=7, found=6, index=6)


# ---------------------------------------------------------------------------------------------
# webdataset not installed
# ---------------------------------------------------------------------------------------------

HIDE_PACKAGES = '''
"""Written by tests/workflow/test_webdataset.py: makes {hidden} look not installed (find_spec -> None)."""
import sys
from importlib.machinery import PathFinder

HIDDEN = {hidden!r}


class HidingPathFinder(PathFinder):
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] in HIDDEN:
            return None
        return super().find_spec(fullname, path, target)


sys.meta_path[:] = [HidingPathFinder if f is PathFinder else f for f in sys.meta_path]
'''

BROKEN_PACKAGE = 'raise ImportError("webdataset is broken here (written by tests/workflow/test_webdataset.py)")\n'


def _without_webdataset_project(workdir: Path, hidden: set[str] | None, broken: bool = False) -> dict:
    blocker = workdir / "blocker"
    blocker.mkdir()
    if hidden:
        (blocker / "sitecustomize.py").write_text(HIDE_PACKAGES.format(hidden=sorted(hidden)))
    if broken:
        (blocker / "webdataset.py").write_text(BROKEN_PACKAGE)
    write_shard(workdir / "shards/p-0000.tar", photo_samples()[:4])
    make_digits_npz(workdir / "digits.npz", n=40)
    write_config(
        workdir,
        {
            "digits": {
                "source": {"kind": "arrays", "path": "digits.npz", "columns": {"image": "images", "label": "target"}},
                "fields": {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}},
                "smoke": {"samples": 4},
            },
            "shards": photo_dataset("shards/p-{0000..0000}.tar"),
        },
    )
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(blocker), os.environ.get("PYTHONPATH")]))}


def _snakemake_env(workdir: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    from conftest import SNAKEFILE

    cmd = [
        str(BIN / "snakemake"),
        "-s",
        str(SNAKEFILE),
        "-d",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        "--cores",
        "2",
        *args,
    ]
    env = {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=workdir)


WARNING = "dataset 'shards' reads WebDataset shards but the optional package `webdataset` is not installed"


def test_without_webdataset_the_dag_warns_and_other_datasets_still_build(tmp_path):
    """webdataset hidden (braceexpand, which betonbuild also imports, still importable)."""
    env = _without_webdataset_project(tmp_path, {"webdataset"})
    result = _snakemake_env(tmp_path, env, "all", "--keep-going")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    before_dag = output.split("Building DAG of jobs")[0]
    assert WARNING in before_dag, output[-4000:]
    assert (
        "betonbuild error: dataset 'shards': this dataset reads WebDataset shards, but the optional package "
        "`webdataset` is not installed"
    ) in output, output[-4000:]
    assert json.loads((tmp_path / "results/digits/digits.verify.json").read_text())["ok"]
    assert not (tmp_path / "results/shards/shards.beton").exists()


def test_without_webdataset_and_braceexpand_other_datasets_still_build(tmp_path):
    """What `pip install betonbuild` without the [webdataset] extra gives: neither package."""
    env = _without_webdataset_project(tmp_path, {"webdataset", "braceexpand"})
    result = _snakemake_env(tmp_path, env, "-n", "all")
    output = result.stdout + result.stderr
    assert "InputFunctionException" not in output and "ModuleNotFoundError" not in output, output[-3000:]
    assert result.returncode == 0, output[-3000:]


def test_a_webdataset_that_fails_to_import_fails_its_dataset_alone(tmp_path):
    """Installed but broken. The workflow does not import webdataset to look (it imports torch: 1.3 s
    at every start), so the dataset's first job that decodes a sample says what is wrong."""
    env = _without_webdataset_project(tmp_path, None, broken=True)
    result = _snakemake_env(tmp_path, env, "all", "--keep-going")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert (
        "betonbuild error: dataset 'shards': this dataset reads WebDataset shards, but the optional package "
        "`webdataset` is installed and fails to import (webdataset is broken here"
    ) in output, output[-4000:]
    assert json.loads((tmp_path / "results/digits/digits.verify.json").read_text())["ok"]
    assert not (tmp_path / "results/shards/shards.beton").exists()


def test_the_workflow_does_not_import_torch_to_build_its_dag(tmp_path):
    """webdataset imports torch (1.3 s): checking that it is installed must not import it."""
    _without_webdataset_project(tmp_path, None)
    cmd = [
        PYTHON,
        "-X",
        "importtime",
        "-m",
        "snakemake",
        "-s",
        str(SNAKEFILE),
        "-d",
        str(tmp_path),
        "--configfile",
        str(tmp_path / "config.yaml"),
        "--cores",
        "2",
        "-n",
        "all",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "snakemake.workflow" in imported
    assert not imported & {"torch", "webdataset", "ffcv"}
