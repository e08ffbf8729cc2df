"""An image folder's file list (betonbuild.sources.folder_listing): the scan's order, the stat
signature that reruns the file_list job, hashing only what changed, and jobs that read the
folder through the listing refusing a file changed since."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import betonbuild.sources.folder_listing as folder_listing
from betonbuild.config.load import load_config
from betonbuild.errors import SampleError, SourceError
from betonbuild.sources import fingerprint_files, listed_files_signature, missing_listed_files, open_source
from betonbuild.sources.folder_listing import LISTING, folder_stat, read_listing, scan_folder, write_listing
from betonbuild.workflow.stages import make_file_list

EXTENSIONS = [".jpg", ".jpeg", ".png"]


def folder_spec(root: Path):
    entry = {
        "source": {"kind": "image_folder", "root": str(root)},
        "fields": {"image": {"type": "rgb_image"}, "label": {"type": "int"}},
    }
    return load_config({"datasets": {"photos": entry}}).datasets["photos"]


def walk_order(root: Path) -> list[str]:
    """The order betonbuild listed folders in before the scan (os.walk, sorted), kept by the scan."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    found = []
    for name in classes:
        for dirpath, dirnames, filenames in os.walk(root / name):
            dirnames.sort()
            for filename in sorted(filenames):
                if Path(filename).suffix.lower() in EXTENSIONS and not filename.startswith("."):
                    found.append(os.path.relpath(os.path.join(dirpath, filename), root))
    return found


def image(path: Path, value: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), value, dtype=np.uint8)).save(path)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    for rel in ["b/2.png", "b/10.PNG", "a/x.png", "a/sub/y.png", "a/sub/deeper/z.jpg", "a/zz/w.png", "c/.hidden.png"]:
        image(root / rel, len(rel))
    (root / "a" / "notes.txt").write_text("not an image")
    (root / ".cache").mkdir()
    (root / "empty").mkdir()
    return root


@pytest.mark.parametrize("find", ["gnu find", "gnu find, parsed a line at a time", "no find"])
def test_the_scan_lists_in_the_order_os_walk_gave(folder: Path, find, monkeypatch):
    image(folder / "loose.png")  # directly in root: not a sample
    if find == "no find":
        monkeypatch.setenv("PATH", "/nonexistent")
    if find.endswith("a line at a time"):
        monkeypatch.setattr(folder_listing, "PARSE_BLOCK_BYTES", 1)
    listing = scan_folder("photos", folder, EXTENSIONS)
    assert listing.rels == walk_order(folder)
    assert listing.classes == ["a", "b", "c", "empty"]
    assert listing.labels.tolist() == [0, 0, 0, 0, 1, 1]
    stats = [os.stat(folder / rel) for rel in listing.rels]
    assert listing.sizes.tolist() == [stat.st_size for stat in stats]
    assert listing.mtimes.tolist() == [stat.st_mtime_ns for stat in stats]  # exact: later jobs compare them
    assert listing.inodes.tolist() == [stat.st_ino for stat in stats]


def test_find_and_the_fallback_list_the_same_files(folder: Path, monkeypatch):
    os.utime(folder / "a" / "x.png", ns=(1, 1))  # a time with nanoseconds below one
    found = scan_folder("photos", folder, EXTENSIONS)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert scan_folder("photos", folder, EXTENSIONS).signature() == found.signature()


@pytest.mark.parametrize("block_bytes", [1, 1 << 20])
@pytest.mark.parametrize("odd_name", ["plain.png", "tab\tin name.png", "newline\nin name.png"])
def test_a_flat_layout_and_odd_names_list_as_os_walk_gave(tmp_path: Path, odd_name: str, block_bytes, monkeypatch):
    """One level of class folders sorts by its own key (a class "a" before "a.b" and "a-b", as
    os.walk gives); a name find's lines cannot carry (a tab, a newline) is listed by the scandir
    scan, whichever block of find's output it is parsed in."""
    monkeypatch.setattr(folder_listing, "PARSE_BLOCK_BYTES", block_bytes)
    root = tmp_path / "flat"
    for rel in ["a.b/1.png", "a-b/1.png", "a/2.png", "a/10.png", "a/" + odd_name, "b/3.jpg"]:
        image(root / rel)
    listing = scan_folder("photos", root, EXTENSIONS)
    assert listing.rels == walk_order(root)
    assert listing.classes == ["a", "a-b", "a.b", "b"]
    assert listing.labels.tolist() == [0, 0, 0, 1, 2, 3]
    assert listing.mtimes.tolist() == [os.stat(root / rel).st_mtime_ns for rel in listing.rels]


@pytest.mark.parametrize("find", ["gnu find", "no find"])
def test_a_broken_link_is_refused_naming_it(folder: Path, find, monkeypatch):
    if find == "no find":
        monkeypatch.setenv("PATH", "/nonexistent")
    (folder / "b" / "gone.png").symlink_to(folder / "nowhere.png")
    with pytest.raises(SourceError, match=f"image file {folder / 'b' / 'gone.png'} cannot be read"):
        scan_folder("photos", folder, EXTENSIONS)


def dag_signature(spec) -> str:
    """The file_list rule's parameter, as a new Snakemake process computes it."""
    folder_stat.cache_clear()
    return listed_files_signature(spec)


CHANGES = [
    lambda root: image(root / "b" / "3.png"),  # added
    lambda root: (root / "b" / "2.png").unlink(),  # removed
    lambda root: (root / "b" / "2.png").rename(root / "b" / "4.png"),  # renamed
    lambda root: (root / "a").rename(root / "aa"),  # a class renamed
    lambda root: os.utime(root / "a" / "x.png", ns=(1, 1)),  # touched (or rewritten, same size)
    lambda root: image(root / "a" / "sub" / "deeper" / "z.jpg", 99),  # rewritten
]


@pytest.mark.parametrize("find", ["gnu find", "no find"])
@pytest.mark.parametrize("change", CHANGES)
def test_the_signature_changes_with_any_image_and_nothing_else(folder: Path, change, find, monkeypatch):
    if find == "no find":  # e.g. BSD find without -printf: the scan's signature
        monkeypatch.setenv("PATH", "/nonexistent")
    spec = folder_spec(folder)
    before, scanned = dag_signature(spec), scan_folder("photos", folder, EXTENSIONS).signature()
    assert (before == scanned) == (find == "no find")
    (folder / "a" / "more-notes.txt").write_text("x")
    (folder / ".cache" / "x.png").write_text("a hidden folder")
    assert dag_signature(spec) == before
    assert scan_folder("photos", folder, EXTENSIONS).signature() == scanned
    change(folder)
    assert dag_signature(spec) != before
    assert scan_folder("photos", folder, EXTENSIONS).signature() != scanned


def test_the_dag_counts_the_images_without_opening_one(folder: Path):
    folder_stat.cache_clear()
    stat = folder_stat("photos", str(folder), tuple(EXTENSIONS))
    listing = scan_folder("photos", folder, EXTENSIONS)
    assert (stat.files, stat.bytes) == (len(listing), int(listing.sizes.sum())) == (6, stat.bytes)


def test_only_new_or_changed_files_are_hashed_again(folder: Path, tmp_path: Path):
    target = tmp_path / "results" / LISTING
    assert write_listing("photos", scan_folder("photos", folder, EXTENSIONS), target) == 6
    assert write_listing("photos", scan_folder("photos", folder, EXTENSIONS), target) == 0
    image(folder / "b" / "2.png", 200)
    image(folder / "b" / "3.png")
    listing = scan_folder("photos", folder, EXTENSIONS)
    assert write_listing("photos", listing, target) == 2
    read = read_listing("photos", target)
    assert read.rels == listing.rels and read.classes == listing.classes
    expected = fingerprint_files([str(folder / rel) for rel in listing.rels])["file_sha256"]
    assert [bytes(digest).hex() for digest in read.sha256] == expected
    for column in ("labels", "sizes", "mtimes", "inodes"):
        assert np.array_equal(getattr(read, column), getattr(listing, column))


def test_a_source_read_through_its_listing_is_the_scanned_source(folder: Path, tmp_path: Path):
    spec = folder_spec(folder)
    make_file_list(spec, str(tmp_path / LISTING))
    listed, scanned = open_source(spec, tmp_path), open_source(spec)
    assert listed.from_listing and not scanned.from_listing
    assert listed.items == scanned.items
    from_listing, hashed_now = listed.inputs_fingerprint(), scanned.inputs_fingerprint()  # the first reads no image
    assert np.array_equal(from_listing.pop("file_sha256"), hashed_now.pop("file_sha256"))
    assert from_listing == hashed_now
    rows = np.array([3, 0, 5])
    assert (
        listed.part_fingerprint(rows, {}) == scanned.part_fingerprint(rows, {}) != listed.part_fingerprint(rows[:2], {})
    )
    assert all(np.array_equal(np.asarray(listed[i][0]), np.asarray(scanned[i][0])) for i in range(len(listed)))


def test_a_file_changed_after_the_listing_is_refused_naming_it(folder: Path, tmp_path: Path):
    spec = folder_spec(folder)
    make_file_list(spec, str(tmp_path / LISTING))
    source = open_source(spec, tmp_path)
    index = source.listing.rels.index("b/2.png")
    shutil.copy(folder / "a" / "x.png", folder / "b" / "2.png")
    os.utime(folder / "b" / "2.png", ns=(5, 5))
    with pytest.raises(SampleError) as info:
        source[index]
    assert (info.value.dataset, info.value.field, info.value.index) == ("photos", "image", index)
    assert f"image file {folder / 'b' / '2.png'} changed after the folder was listed" in str(info.value)
    assert source.encoded_image(index) is None  # nor is its stored copy compared with a changed file
    source[0]  # the others still read


def test_a_missing_or_empty_folder_is_a_source_error_of_the_file_list_job(tmp_path: Path):
    with pytest.raises(SourceError, match="image folder .*missing does not exist"):
        make_file_list(folder_spec(tmp_path / "missing"), str(tmp_path / LISTING))
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(SourceError, match="has no images in class sub-folders"):
        make_file_list(folder_spec(tmp_path / "empty"), str(tmp_path / LISTING))
    assert not (tmp_path / LISTING).exists()
    assert dag_signature(folder_spec(tmp_path / "missing")) == "missing"
    # the file_list rule's one input: Snakemake names a missing folder before any job runs
    assert missing_listed_files(folder_spec(tmp_path / "missing")) == [str(tmp_path / "missing")]
    assert missing_listed_files(folder_spec(tmp_path / "empty")) == []


def resident_mib() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


def test_the_hashing_processes_are_forked_before_the_listing_exists(folder: Path, tmp_path: Path):
    """The file_list job forks its hashers before it lists the folder: forked after, each one's RSS
    held the parent's whole listing again (Snakemake's max_rss sums them)."""
    with folder_listing.hashing_pool(2) as pool:
        listing = [f"n{i:08d}/n{i:08d}_{i}.JPEG" for i in range(1_000_000)]  # ~90 MiB, as a listing of 1M files
        hashers = [pool.submit(resident_mib).result() for _ in range(2)]
        assert resident_mib() > 80 + max(hashers), (resident_mib(), hashers)
        assert write_listing("photos", scan_folder("photos", folder, EXTENSIONS), tmp_path / LISTING, pool=pool) == 6
    del listing
    assert read_listing("photos", tmp_path / LISTING).rels == walk_order(folder)


def test_hashes_are_the_same_in_one_process_on_forked_ones_and_on_a_given_pool(folder: Path, monkeypatch):
    monkeypatch.setattr(folder_listing, "HASH_BATCH", 2)  # 6 files: 3 batches, handed to the workers
    paths = scan_folder("photos", folder, EXTENSIONS).paths(list(range(6)))
    serial = folder_listing.hash_files("photos", paths, 1)
    assert np.array_equal(folder_listing.hash_files("photos", paths, 2), serial)
    with folder_listing.hashing_pool(2) as pool:
        assert np.array_equal(folder_listing.hash_files("photos", paths, 1, pool), serial)
    assert bytes(serial[0]) == hashlib.sha256(Path(paths[0]).read_bytes()).digest()
