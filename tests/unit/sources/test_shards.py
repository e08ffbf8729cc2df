"""The shard list (betonbuild.sources.shards): shards counted from tar headers as webdataset groups
them, cached per shard, damaged shards refused naming shard, member and key; the smoke samples'
fingerprint; and the shard list and manifest jobs without webdataset or torch."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from wds_samples import (
    DAMAGE,
    LONG_DIR,
    damaged_tar,
    odd_tar,
    photo_dataset,
    photo_samples,
    photo_shard_bytes,
    wds_spec,
    write_shard,
)

import betonbuild.sources.shards as shards_module
from betonbuild.errors import SampleError, SourceError
from betonbuild.sources import sha256_file
from betonbuild.sources.shards import count_shard, expand_shards, shard_list
from betonbuild.sources.webdataset import WebDatasetSource

wds = pytest.importorskip("webdataset")


@pytest.fixture
def photo_shards(tmp_path, monkeypatch) -> list[Path]:
    monkeypatch.chdir(tmp_path)
    samples = photo_samples()
    return [write_shard(tmp_path / f"s/p-{i}.tar", samples[i * 7 : (i + 1) * 7]) for i in range(3)]


def test_the_shard_list_and_the_manifest_do_not_import_webdataset_or_torch(photo_shards):
    """webdataset imports torch (about 1.2 s per job): the jobs that only count do without it."""
    script = (
        "import sys, json\n"
        "from betonbuild.config.load import load_config\n"
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
    monkeypatch.chdir(tmp_path)
    samples = photo_samples()[:3]
    samples[1]["jpg"] = b"not a jpeg at all"
    write_shard(tmp_path / "x.tar", samples)
    assert count_shard(wds_spec("x.tar"), "x.tar")["samples"] == 3


def test_count_shard_names_shard_key_and_field_of_a_missing_member(tmp_path, monkeypatch):
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
    monkeypatch.chdir(tmp_path)
    samples = photo_samples()[:2]
    del samples[1]["json"]
    write_shard(tmp_path / "x.tar", samples)
    assert count_shard(wds_spec("x.tar", keys=None, pipeline="mod:fn"), "x.tar")["samples"] == 2


@pytest.mark.parametrize("adjacent", [True, False])
def test_count_shard_refuses_a_duplicate_sample_key(tmp_path, monkeypatch, adjacent):
    monkeypatch.chdir(tmp_path)
    samples = photo_samples()[:3]
    twin = dict(samples[0])
    samples.insert(1 if adjacent else 3, twin)
    write_shard(tmp_path / "x.tar", samples)
    with pytest.raises(SourceError) as info:
        count_shard(wds_spec("x.tar"), "x.tar")
    assert "shard x.tar" in str(info.value) and repr(twin["__key__"]) in str(info.value), str(info.value)


def test_expand_shards_brace_glob_and_list(tmp_path, monkeypatch):
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
    listing = shard_list(wds_spec("s/p-{0..2}.tar"), "cache.json")
    assert listing["samples"] == 20 and listing["dataset"] == "d"
    for entry, path in zip(listing["shards"], photo_shards):
        stat = path.stat()
        assert entry["path"] == f"s/{path.name}"
        assert (entry["size"], entry["mtime_ns"]) == (stat.st_size, stat.st_mtime_ns)
        assert entry["sha256"] == sha256_file(path)
    assert [e["samples"] for e in listing["shards"]] == [7, 7, 6]


def test_shard_list_recounts_only_the_added_and_the_changed_shard(photo_shards, monkeypatch):
    calls: list[str] = []
    real = shards_module.count_shard
    monkeypatch.setattr(shards_module, "count_shard", lambda spec, path: calls.append(path) or real(spec, path))
    spec = wds_spec("s/p-*.tar")
    first = shards_module.shard_list(spec, "cache.json")
    assert sorted(calls) == ["s/p-0.tar", "s/p-1.tar", "s/p-2.tar"]

    calls.clear()
    assert shards_module.shard_list(spec, "cache.json") == first
    assert calls == []

    samples = photo_samples()
    write_shard(Path("s/p-1.tar"), samples[7:13])  # one sample fewer
    write_shard(Path("s/p-3.tar"), samples[:2])
    calls.clear()
    second = shards_module.shard_list(spec, "cache.json")
    assert sorted(calls) == ["s/p-1.tar", "s/p-3.tar"]
    assert [e["samples"] for e in second["shards"]] == [7, 6, 6, 2]
    assert second["shards"][0] == first["shards"][0] and second["shards"][2] == first["shards"][2]

    Path("s/p-0.tar").unlink()
    calls.clear()
    third = shards_module.shard_list(spec, "cache.json")
    assert calls == [] and [e["path"] for e in third["shards"]] == ["s/p-1.tar", "s/p-2.tar", "s/p-3.tar"]


def test_shard_list_of_a_missing_shard_names_it(photo_shards):
    with pytest.raises(SourceError, match=r"shard s/p-3\.tar does not exist"):
        shard_list(wds_spec("s/p-{0..3}.tar"), "cache.json")


def test_the_smoke_fingerprint_covers_exactly_its_samples_bytes(photo_shards):
    """samples_fingerprint reads the chosen samples' members at their offsets: a change to another sample
    of the same shard leaves it alone; a compressed shard (no offsets) counts as a whole."""
    import gzip

    spec = wds_spec("s/p-{0..2}.tar")

    def digest(rows) -> str:
        Path("shards.json").write_text(json.dumps(shard_list(spec, "cache.json")))
        return WebDatasetSource(spec, "shards.json").samples_fingerprint(np.array(rows))

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


@pytest.mark.parametrize("fmt", ["ustar", "gnu", "pax"])
def test_count_shard_groups_samples_as_webdataset_does(tmp_path, monkeypatch, fmt):
    """The count and the keys of what webdataset itself yields from the same shard."""
    monkeypatch.chdir(tmp_path)
    path = odd_tar(tmp_path / "odd.tar", fmt)
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


@pytest.mark.parametrize("how", DAMAGE)
def test_count_shard_refuses_a_damaged_tar_naming_shard_member_and_key(tmp_path, monkeypatch, how):
    monkeypatch.chdir(tmp_path)
    data, members = photo_shard_bytes(tmp_path)
    damaged, expect = damaged_tar(data, members, how)
    Path("bad.tar").write_bytes(damaged)
    started = time.monotonic()
    with pytest.raises(SourceError) as info:
        count_shard(wds_spec("bad.tar"), "bad.tar")
    message = str(info.value)
    assert message.startswith("dataset 'd': shard bad.tar is "), message
    for part in expect:
        assert part in message, f"{part!r} not in {message!r}"
    assert time.monotonic() - started < 2


def test_count_shard_reads_compressed_shards_and_refuses_a_cut_one(tmp_path, monkeypatch):
    import gzip

    monkeypatch.chdir(tmp_path)
    data, members = photo_shard_bytes(tmp_path)
    Path("good.tar.gz").write_bytes(gzip.compress(data))
    assert count_shard(wds_spec("good.tar.gz"), "good.tar.gz") == count_shard(wds_spec("good.tar"), "good.tar")
    Path("cut_tar.tar.gz").write_bytes(gzip.compress(damaged_tar(data, members, "cut_inside_payload")[0]))
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
    monkeypatch.chdir(tmp_path)
    data, members = photo_shard_bytes(tmp_path)
    damaged = bytearray(data)
    header = next(start for name, start, _ in members if name == "astronaut_1.jpg") + 1024  # after its PAX header
    damaged[header + 156 : header + 157] = b"S"
    checksum = 256 + sum(damaged[header : header + 148]) + sum(damaged[header + 156 : header + 512])
    damaged[header + 148 : header + 156] = b"%06o\0 " % checksum
    Path("sparse.tar").write_bytes(bytes(damaged))
    with pytest.raises(SourceError, match="GNU sparse file, which betonbuild does not read"):
        count_shard(wds_spec("sparse.tar"), "sparse.tar")
