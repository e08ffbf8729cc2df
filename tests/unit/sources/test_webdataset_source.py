"""The webdataset source (betonbuild.sources.webdataset): indexed reading in shard order, from two
threads, and its config checks (local shards only, no shuffle or indices, keys name fields)."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from wds_samples import decoded_image, photo_samples, wds_spec, write_shard

from betonbuild.config.load import load_config
from betonbuild.errors import ConfigError
from betonbuild.sources.shards import shard_list
from betonbuild.sources.webdataset import WebDatasetSource

pytest.importorskip("webdataset")


@pytest.fixture
def photo_shards(tmp_path, monkeypatch) -> list[Path]:
    monkeypatch.chdir(tmp_path)
    samples = photo_samples()
    return [write_shard(tmp_path / f"s/p-{i}.tar", samples[i * 7 : (i + 1) * 7]) for i in range(3)]


def test_indexed_source_reads_every_sample_in_shard_order(photo_shards):
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
