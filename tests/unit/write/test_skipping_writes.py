"""bad_samples: {policy: skip}: bad samples are left out of real ffcv writes, recorded, bounded, verified."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pytest

from betonbuild.beton.checks import structural_checks
from betonbuild.beton.format import BetonFile
from betonbuild.config.load import load_config
from betonbuild.provenance import ffcv_build
from betonbuild.sources import open_source
from betonbuild.verify import verify_beton
from betonbuild.write import beton_writer
from betonbuild.write.skips import SkipLimit, SkippedSample, TooManyBadSamples, kept_blocks, renumber
from betonbuild.write.writer import write_beton

# ffcv's Loader leaves numba dispatchers whose finalizers raise KeyError at garbage collection

N = 60
BAD = (3, 17, 40)


class RaisingDataset:
    """A python source whose __getitem__ raises for some indices; sample i holds i in every field."""

    def __init__(self, bad=BAD, n=N):
        self.bad, self.n = set(bad), n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        i = int(i)
        if i in self.bad:
            raise ValueError(f"record {i} is corrupt")
        return np.full(4, i, dtype=np.uint8), i, {"i": i}

    def fixed_columns(self):  # what verification asks a source (no fast columns here)
        return {}

    def encoded_image(self, index):
        return None


FIELDS = {"x": {"type": "ndarray", "dtype": "uint8", "shape": [4]}, "y": {"type": "int"}, "j": {"type": "json"}}


def make_spec(policy="skip", max_=5, fields=FIELDS, **extra):
    entry = {
        "source": {"kind": "python", "factory": "x:y"},
        "fields": fields,
        "writer": {"chunksize": 7},
        "bad_samples": {"policy": policy, "max": max_},
        "verify": {"mode": "full"},
        **extra,
    }
    return load_config({"datasets": {"d": entry}}).datasets["d"]


def write(tmp_path, spec, source, workers=2, limit=5, name="out.beton"):
    skip = SkipLimit("d", limit, len(source), "full", len(source)) if spec.bad_samples.skip else None
    with open("/dev/null", "w") as log:
        record = write_beton(spec, source, np.arange(len(source)), tmp_path / name, workers, log=log, skip=skip)
    return record, tmp_path / name


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_python_source_raising_for_some_indices_writes_the_rest_in_order(tmp_path, monkeypatch, workers):
    monkeypatch.setattr(beton_writer, "TABLE_BLOCK", 40)  # the kept rows copied (and released) a few at a time
    spec = make_spec()
    record, path = write(tmp_path, spec, RaisingDataset(), workers)
    kept = [i for i in range(N) if i not in BAD]
    assert record["num_samples"] == N - len(BAD)
    assert [(s["position"], s["index"]) for s in record["skipped"]["samples"]] == [(i, i) for i in BAD]
    assert "ValueError: record 17 is corrupt" in record["skipped"]["samples"][1]["message"]
    beton = BetonFile(path)
    assert beton.num_samples == N - len(BAD)
    assert beton.metadata["y"].tolist() == kept
    assert [c["name"] for c in structural_checks(beton) if not c["ok"]] == []
    from ffcv.reader import Reader

    reader = Reader(str(path))
    assert reader.num_samples == N - len(BAD)
    assert reader.metadata["f1"].tolist() == kept


def test_the_compacted_file_verifies_against_the_source_minus_the_recorded_samples(tmp_path):
    spec = make_spec()
    record, path = write(tmp_path, spec, RaisingDataset(), 2)
    skipped = [SkippedSample(**s) for s in record["skipped"]["samples"]]
    report = verify_beton(spec, RaisingDataset(), np.arange(N), str(path), ffcv_build(), skipped=skipped, skip_limit=5)
    assert report["ok"], report["worst"]
    assert report["skipped"]["count"] == 3
    assert report["num_samples"] == {"expected": N - 3, "found": N - 3, "planned": N}
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["loader_batch"]["ok"], checks["loader_batch"]["detail"]
    assert checks["skipped_samples"]["count"] == 3


def test_a_recorded_skip_whose_sample_is_in_the_file_fails_verification(tmp_path):
    spec = make_spec()
    record, path = write(tmp_path, spec, RaisingDataset(bad=(3,)), 1)
    recorded = [SkippedSample(**s) for s in record["skipped"]["samples"]]
    also = SkippedSample(position=10, index=10, field=None, message="claimed")
    report = verify_beton(
        spec, RaisingDataset(bad=(3,)), np.arange(N), str(path), ffcv_build(), skipped=[*recorded, also], skip_limit=5
    )
    assert not report["ok"]
    assert report["worst"].startswith("num_samples: file has 59, expected 58")


def test_a_missing_sample_that_was_not_recorded_fails_verification(tmp_path):
    spec = make_spec()
    record, path = write(tmp_path, spec, RaisingDataset(bad=(3, 17)), 1)
    only_first = [SkippedSample(**record["skipped"]["samples"][0])]
    report = verify_beton(
        spec, RaisingDataset(bad=(3, 17)), np.arange(N), str(path), ffcv_build(), skipped=only_first, skip_limit=5
    )
    assert not report["ok"]
    assert report["worst"].startswith("num_samples: file has 58, expected 59")


def test_a_skip_recorded_at_the_wrong_row_fails_the_content_check(tmp_path):
    """Same count, other membership: row 17 was skipped, the record says row 20."""
    spec = make_spec()
    _, path = write(tmp_path, spec, RaisingDataset(bad=(17,)), 1)
    wrong = [SkippedSample(position=20, index=20, field=None, message="claimed")]
    report = verify_beton(
        spec, RaisingDataset(bad=()), np.arange(N), str(path), ffcv_build(), skipped=wrong, skip_limit=5
    )
    assert not report["ok"]
    failed = {c["name"] for c in report["checks"] if not c["ok"]}
    assert "fixed_fields" in failed


def test_skip_with_nothing_bad_and_fail_write_the_same_bytes(tmp_path):
    _, skipping = write(tmp_path, make_spec(), RaisingDataset(bad=()), 1, name="skip.beton")
    record, failing = write(tmp_path, make_spec("fail"), RaisingDataset(bad=()), 1, name="fail.beton")
    assert "skipped" not in record
    assert sha256(skipping) == sha256(failing)


def test_fail_still_stops_at_the_first_bad_sample(tmp_path):
    from betonbuild.errors import SampleError

    with pytest.raises(SampleError, match="sample index 3: the source's __getitem__ raised ValueError"):
        write(tmp_path, make_spec("fail"), RaisingDataset(), 1)
    assert not (tmp_path / "out.beton").exists()


def test_more_bad_samples_than_max_stops_with_the_list_and_no_file(tmp_path):
    with pytest.raises(TooManyBadSamples) as caught:
        write(tmp_path, make_spec(max_=2), RaisingDataset(), 2, limit=2)
    message = str(caught.value)
    assert "3 bad samples in the full write, more than bad_samples.max allows (2 of 60)" in message
    for i in BAD:
        assert f"index {i}: the source's __getitem__ raised ValueError: record {i} is corrupt" in message
    assert [s.index for s in caught.value.skipped] == list(BAD)
    assert not (tmp_path / "out.beton").exists()
    assert not list(tmp_path.glob(".out.beton*"))


def test_every_sample_bad_stops_after_max_not_with_an_empty_file(tmp_path):
    spec = make_spec(max_=4)
    with pytest.raises(TooManyBadSamples, match=r"5 bad samples in the full write, more than .* \(4 of 60\)"):
        write(tmp_path, spec, RaisingDataset(bad=range(N)), 1, limit=4)
    assert not (tmp_path / "out.beton").exists()


def test_a_limit_as_large_as_the_write_still_refuses_an_empty_file(tmp_path):
    with pytest.raises(TooManyBadSamples, match="all 6 samples of the full write are bad; no .beton is written"):
        write(tmp_path, make_spec(max_=100), RaisingDataset(bad=range(6), n=6), 1, limit=100)
    assert not (tmp_path / "out.beton").exists()


def test_a_sample_failing_in_ffcvs_encode_after_an_allocation_is_taken_back(tmp_path):
    """Sample 5's second field is bigger than a page: its first field was already allocated."""
    fields = {"x": {"type": "ndarray", "dtype": "uint8", "shape": [4]}, "b": {"type": "bytes"}}

    class BigOne:
        def __len__(self):
            return 12

        def __getitem__(self, i):
            size = (3 << 20) if int(i) == 5 else 100
            return np.full(4, int(i), dtype=np.uint8), np.full(size, int(i) % 251, dtype=np.uint8)

        def fixed_columns(self):
            return {}

    spec = make_spec(fields=fields, writer={"chunksize": 7, "page_size": "2MiB"})
    record, path = write(tmp_path, spec, BigOne(), 1)
    assert [s["index"] for s in record["skipped"]["samples"]] == [5]
    assert "one page holds 2097152" in record["skipped"]["samples"][0]["message"]
    beton = BetonFile(path, custom_handlers={})
    assert [c["name"] for c in structural_checks(beton) if not c["ok"]] == []
    assert beton.ndarray_column("x", np.arange(11))[:, 0].tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    assert bytes(beton.variable_payload("b", 5)) == bytes([6]) * 100


def _image_folder_with_a_broken_jpeg(root: Path) -> Path:
    from PIL import Image

    from betonbuild.demo import colour_photos, crops

    photos = colour_photos()
    for name in ("astronaut", "coffee"):
        (root / name).mkdir(parents=True)
        for k, crop in enumerate(crops(photos[name], size=48, count=4)):
            out = io.BytesIO()
            Image.fromarray(crop).save(out, format="JPEG", quality=90)
            data = out.getvalue()
            if name == "coffee" and k == 2:
                data = data[: len(data) // 3]  # truncated: PIL refuses to load it
            (root / name / f"{k}.jpg").write_bytes(data)
    return root / "coffee" / "2.jpg"


def test_an_image_folder_with_one_broken_jpeg_skips_it_and_names_the_file(tmp_path, monkeypatch):
    broken = _image_folder_with_a_broken_jpeg(tmp_path / "photos")
    monkeypatch.chdir(tmp_path)
    spec = load_config(
        {
            "datasets": {
                "d": {
                    "source": {"kind": "image_folder", "root": "photos"},
                    "fields": {"image": {"type": "rgb_image", "write_mode": "raw"}, "label": {"type": "int"}},
                    "bad_samples": {"policy": "skip", "max": 1},
                    "verify": {"mode": "full"},
                }
            }
        }
    ).datasets["d"]
    source = open_source(spec)
    bad = [i for i in range(len(source)) if Path(source.listing.rels[i]) == Path("coffee/2.jpg")]
    record, path = write(tmp_path, spec, source, 2, limit=1)
    (skipped,) = record["skipped"]["samples"]
    assert skipped["index"] == bad[0]
    assert skipped["field"] == "image"
    assert str(broken.name) in skipped["message"]
    assert skipped["location"] == f"file {Path('photos') / 'coffee' / '2.jpg'}"
    report = verify_beton(
        spec, source, np.arange(len(source)), str(path), ffcv_build(), skipped=[SkippedSample(**skipped)], skip_limit=1
    )
    assert report["ok"], report["worst"]
    assert report["num_samples"]["found"] == 7


def test_an_image_changed_since_it_was_listed_is_not_skipped_but_fails(tmp_path, monkeypatch):
    """A file edited during the build is not a bad sample: skipping it would drop a good image."""
    from betonbuild.errors import SampleError
    from betonbuild.workflow.stages import make_file_list

    _image_folder_with_a_broken_jpeg(tmp_path / "photos")
    (tmp_path / "photos" / "coffee" / "2.jpg").unlink()
    monkeypatch.chdir(tmp_path)
    entry = {
        "source": {"kind": "image_folder", "root": "photos"},
        "fields": {"image": {"type": "rgb_image", "write_mode": "raw"}, "label": {"type": "int"}},
        "bad_samples": {"policy": "skip", "max": 3},
    }
    spec = load_config({"datasets": {"d": entry}}).datasets["d"]
    with open("/dev/null", "w") as log:
        make_file_list(spec, str(tmp_path / "files.npz"), log=log)
    source = open_source(spec, tmp_path)
    edited = tmp_path / "photos" / "astronaut" / "1.jpg"
    edited.write_bytes(edited.read_bytes() + b"\0")
    with pytest.raises(SampleError, match="run snakemake again") as caught:
        write(tmp_path, spec, source, 1, limit=3)
    assert not isinstance(caught.value, TooManyBadSamples)
    assert not (tmp_path / "out.beton").exists()


def test_a_webdataset_shard_with_a_broken_member_skips_that_sample(tmp_path, monkeypatch):
    pytest.importorskip("webdataset")
    from betonbuild.workflow.stages import make_shard_list
    from tests.wds_samples import PHOTO_FIELDS, photo_dataset, photo_samples, write_shard

    samples = photo_samples()[:6]
    samples[4]["jpg"] = samples[4]["jpg"][:200]  # a truncated JPEG member
    write_shard(tmp_path / "wds" / "s-0.tar", samples)
    monkeypatch.chdir(tmp_path)
    entry = {**photo_dataset(["wds/s-0.tar"]), "fields": PHOTO_FIELDS, "bad_samples": {"policy": "skip", "max": 2}}
    spec = load_config({"datasets": {"d": entry}}).datasets["d"]
    make_shard_list(spec, str(tmp_path / "shards.json"))
    source = open_source(spec, tmp_path)
    record, path = write(tmp_path, spec, source, 1, limit=2)
    (skipped,) = record["skipped"]["samples"]
    assert skipped["index"] == 4
    assert "s-0.tar" in skipped["location"]
    assert BetonFile(path).num_samples == 5
    report = verify_beton(
        spec, source, np.arange(6), str(path), ffcv_build(), skipped=[SkippedSample(**skipped)], skip_limit=2
    )
    assert report["ok"], report["worst"]


def test_kept_blocks_and_renumbering():
    skipped = np.array([0, 3, 4, 9])
    assert list(kept_blocks(10, skipped)) == [(1, 3), (5, 9)]
    assert list(kept_blocks(3, np.array([], dtype=np.int64))) == [(0, 3)]
    from ffcv.types import ALLOC_TABLE_TYPE

    table = np.zeros(5, dtype=ALLOC_TABLE_TYPE)
    table["sample_id"] = [1, 2, 5, 8, 3]
    table["ptr"] = [10, 20, 50, 80, 30]
    out = renumber(table, skipped)
    assert out["sample_id"].tolist() == [0, 1, 2, 5]
    assert out["ptr"].tolist() == [10, 20, 50, 80]


@pytest.mark.parametrize(
    "max_, total, limit, smoke_limit",
    [(5, 1000, 5, 1), (0.001, 4_000_000, 4000, 1), (0.5, 64, 32, 32), (0, 100, 0, 0), (1000, 100, 1000, 63)],
)
def test_the_limit_is_a_count_or_a_fraction_and_the_smoke_stage_gets_its_share(max_, total, limit, smoke_limit):
    policy = make_spec(max_=max_).bad_samples
    assert policy.limit(total) == limit
    assert policy.smoke_limit(64, total) == smoke_limit


def test_a_max_that_is_neither_a_count_nor_a_fraction_is_refused():
    from betonbuild.errors import ConfigError

    with pytest.raises(ConfigError, match=r"datasets.d.bad_samples.max: 2.5 is neither a count"):
        make_spec(max_=2.5)


def test_fail_is_the_default_and_leaves_the_rule_params_as_they_were():
    spec = load_config(
        {"datasets": {"d": {"source": {"kind": "python", "factory": "x:y"}, "fields": FIELDS}}}
    ).datasets["d"]
    assert spec.bad_samples.policy == "fail"
    assert "bad_samples" not in spec.to_dict()
    assert make_spec().to_dict()["bad_samples"] == {"policy": "skip", "max": 5}
