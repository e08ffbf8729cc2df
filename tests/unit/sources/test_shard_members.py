"""``sources.shard_members``: single members of an uncompressed shard, read by offset, equal to the
samples webdataset itself yields; no index (so webdataset reads it) for a shard that is compressed,
changed since it was listed, or damaged."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from betonbuild.sources import shard_members
from betonbuild.sources.shard_members import ShardMembers
from tests.wds_samples import photo_samples, write_shard


def webdataset_samples(path: Path) -> list[dict]:
    import webdataset as wds

    return list(wds.WebDataset(str(path), shardshuffle=False, empty_check=False))


def test_every_member_read_by_offset_is_the_one_webdataset_yields(tmp_path: Path):
    path = write_shard(tmp_path / "a.tar", photo_samples())
    expected = webdataset_samples(path)
    members = ShardMembers()
    for local, sample in enumerate(expected):
        extensions = [k for k in sample if not k.startswith("__")]
        alternatives = [("absent", ext) for ext in extensions]  # the first present one of each
        key, found, payloads = members.sample(str(path), path.stat().st_size, len(expected), local, alternatives)
        assert key == sample["__key__"]
        assert sorted(found) == sorted(extensions)
        assert payloads == {ext: sample[ext] for ext in extensions}


def test_a_read_is_never_of_a_descriptor_another_thread_closed_and_reused(tmp_path: Path, monkeypatch):
    """While one thread reads a member, another reads other shards and evicts this one's index (its
    descriptor closed, the number given to the next shard opened): the read still returns this
    shard's bytes. Reading after the lookup, outside the lock, it returned another shard's label
    at the same offset (benchmark 9, 10,000 shards of 10 samples: 3 labels of 100,000 "differed")."""
    import threading

    labels = [write_shard(tmp_path / f"{k}.tar", [{"__key__": "000", "cls": b"%03d" % k}]) for k in range(8)]
    members = ShardMembers()
    real_read, others = shard_members._read, threading.Event()

    def read_while_others_evict(fd, offset, nbytes):
        if not others.is_set():
            others.set()
            evict = threading.Thread(
                target=lambda: [members.sample(str(p), p.stat().st_size, 1, 0, [("cls",)]) for p in labels[1:]]
            )
            evict.start()
            evict.join(timeout=0.5)  # under the lock it waits for this read; before, it closed our descriptor
        return real_read(fd, offset, nbytes)

    monkeypatch.setattr(shard_members, "_read", read_while_others_evict)
    _, _, payloads = members.sample(str(labels[0]), labels[0].stat().st_size, 1, 0, [("cls",)])
    assert payloads == {"cls": b"000"}
    for k, path in enumerate(labels):  # and every shard still reads its own
        assert members.sample(str(path), path.stat().st_size, 1, 0, [("cls",)])[2] == {"cls": b"%03d" % k}


def test_a_compressed_changed_or_damaged_shard_has_no_index(tmp_path: Path):
    path = write_shard(tmp_path / "a.tar", photo_samples())
    size, count = path.stat().st_size, 20
    packed = tmp_path / "a.tar.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    members = ShardMembers()
    assert members.sample(str(packed), packed.stat().st_size, count, 0, []) is None
    assert members.sample(str(path), size, count + 1, 0, []) is None, "another count than listed"
    assert members.sample(str(path), size + 512, count, 0, []) is None, "another size than listed"
    cut = tmp_path / "cut.tar"
    cut.write_bytes(path.read_bytes()[: size // 2])
    assert members.sample(str(cut), size // 2, count, 0, []) is None


def test_only_the_last_few_shards_keep_an_open_descriptor(tmp_path: Path):
    samples = photo_samples()
    paths = [write_shard(tmp_path / f"{k}.tar", samples[:2]) for k in range(shard_members.KEEP + 3)]
    members = ShardMembers()
    before = len(os.listdir("/proc/self/fd"))
    for path in paths:
        members.sample(str(path), path.stat().st_size, 2, 1, [])
    assert len(os.listdir("/proc/self/fd")) - before == shard_members.KEEP
    del members
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("compressed", [False, True])
def test_the_verification_reads_label_members_alone_or_through_webdataset(tmp_path: Path, monkeypatch, compressed):
    """Of an uncompressed shard the verification reads the label members' bytes and nothing else:
    webdataset's iteration is not used. A compressed shard is read through webdataset, and passes."""
    from betonbuild.config.load import load_config
    from betonbuild.sources.webdataset import WebDatasetSource
    from tests.unit.verify.test_write_evidence import built, check, verify

    samples = photo_samples()
    for k in range(2):
        path = write_shard(tmp_path / "shards" / f"a-{k}.tar", samples[10 * k : 10 * k + 10])
        if compressed:
            path.with_suffix(".tar.gz").write_bytes(gzip.compress(path.read_bytes()))
            path.unlink()
    entry = {
        "source": {
            "kind": "webdataset",
            "shards": str(tmp_path / "shards" / ("a-{0..1}.tar" + (".gz" if compressed else ""))),
            "keys": {"image": "jpg;png", "label": "cls"},
        },
        "fields": {"image": {"type": "rgb_image", "write_mode": "jpg"}, "label": {"type": "int"}},
        "verify": {"mode": "full"},
    }
    w = built(load_config({"datasets": {"wds": entry}}).datasets["wds"], tmp_path)
    read_bytes, through_webdataset = [], []
    real_read, real_raw = shard_members._read, WebDatasetSource.raw
    monkeypatch.setattr(shard_members, "_read", lambda fd, o, n: read_bytes.append(n) or real_read(fd, o, n))
    monkeypatch.setattr(WebDatasetSource, "raw", lambda self, i: through_webdataset.append(i) or real_raw(self, i))
    report = verify(w)
    assert report["ok"], report["worst"]
    assert check(report, "fixed_fields")["fields"]["label"] == {"compared": 20, "mismatches": 0}
    if compressed:
        assert read_bytes == [] and len(through_webdataset) == 20
    else:
        assert through_webdataset == [] and len(read_bytes) == 20 and max(read_bytes) <= 2, "only the cls members"
