"""Unit tests of betonbuild.sources: arrays, image folders, python factories, input files, fingerprints."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from betonbuild.config.load import load_config
from betonbuild.config.spec import DatasetSpec
from betonbuild.demo import colour_photos, crops
from betonbuild.errors import SampleError, SourceError
from betonbuild.sources import (
    ArraysSource,
    ImageFolderSource,
    PythonSource,
    adapter_files,
    fingerprint_files,
    input_files,
    open_source,
    sha256_file,
)
from betonbuild.write.contract import check_sample

DIGIT_FIELDS = {"image": {"type": "ndarray", "dtype": "uint8", "shape": [8, 8]}, "label": {"type": "int"}}
FOLDER_FIELDS = {"image": {"type": "rgb_image"}, "label": {"type": "int"}}


def make_spec(source: dict, fields: dict, name: str = "ds") -> DatasetSpec:
    return load_config({"datasets": {name: {"source": source, "fields": fields}}}).datasets[name]


def source_error(cls, spec) -> SourceError:
    with pytest.raises(SourceError) as info:
        cls(spec)
    assert info.value.dataset == spec.name
    assert str(info.value).startswith(f"dataset '{spec.name}': ")
    return info.value


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch):
    """tmp_path as the working directory; sys.path and user modules imported from it are restored after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    root = os.path.realpath(tmp_path)
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None) or ""
        if origin and os.path.realpath(origin).startswith(root + os.sep):
            del sys.modules[name]


def write_module(directory: Path, relpath: str, code: str) -> Path:
    path = directory / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(code))
    return path


# --- arrays --------------------------------------------------------------------------------------


def test_arrays_npz_columns_give_samples_in_field_order(digits_npz: Path):
    from sklearn.datasets import load_digits

    digits = load_digits()
    spec = make_spec(
        {"kind": "arrays", "path": str(digits_npz), "columns": {"label": "target", "image": "images"}}, DIGIT_FIELDS
    )
    source = open_source(spec)
    assert isinstance(source, ArraysSource)
    assert len(source) == 300
    image, label = source[17]
    assert np.array_equal(image, digits.images[17].astype(np.uint8))
    assert label == digits.target[17]
    assert source.files == [str(digits_npz)]
    assert source.sample_sizes().tolist() == [64 + 8] * 300
    assert source.sample_sizes().strides == (0,), "one value for every row: no memory per row at 100M rows"
    from betonbuild.write.preflight import largest_rows  # noqa: PLC0415 - its caller, used here only

    assert largest_rows(source, np.arange(300)).tolist() == []  # equal rows: the smoke samples say it all
    # The values pass the strict contract as they are.
    values = check_sample(spec, source[17], 17)
    assert values[1] == int(digits.target[17]) and values[0].dtype == np.uint8


def test_arrays_npy_columns_are_read_per_field(tmp_path: Path):
    from sklearn.datasets import load_digits

    digits = load_digits()
    images, labels = tmp_path / "images.npy", tmp_path / "labels.npy"
    np.save(images, digits.images[:50].astype(np.uint8))
    np.save(labels, digits.target[:50].astype(np.int64))
    spec = make_spec({"kind": "arrays", "columns": {"image": str(images), "label": str(labels)}}, DIGIT_FIELDS)
    source = ArraysSource(spec)
    assert len(source) == 50
    assert source.files == [str(images), str(labels)]
    for index in (0, 49):
        image, label = source[index]
        assert np.array_equal(image, digits.images[index])
        assert int(label) == digits.target[index]


def test_arrays_columns_of_different_lengths_are_an_error(tmp_path: Path):
    images, labels = tmp_path / "images.npy", tmp_path / "labels.npy"
    np.save(images, np.zeros((10, 8, 8), dtype=np.uint8))
    np.save(labels, np.zeros(9, dtype=np.int64))
    spec = make_spec({"kind": "arrays", "columns": {"image": str(images), "label": str(labels)}}, DIGIT_FIELDS)
    error = source_error(ArraysSource, spec)
    assert error.why == "columns have different lengths: {'image': 10, 'label': 9}"


def test_arrays_npz_keys_of_different_lengths_are_an_error(tmp_path: Path):
    path = tmp_path / "bad.npz"
    np.savez(path, images=np.zeros((5, 8, 8), np.uint8), target=np.zeros(6, np.int64))
    spec = make_spec(
        {"kind": "arrays", "path": str(path), "columns": {"image": "images", "label": "target"}}, DIGIT_FIELDS
    )
    assert "columns have different lengths: {'image': 5, 'label': 6}" in str(source_error(ArraysSource, spec))


def test_arrays_missing_file_error_names_the_path(tmp_path: Path):
    missing = tmp_path / "nowhere" / "digits.npz"
    spec = make_spec(
        {"kind": "arrays", "path": str(missing), "columns": {"image": "images", "label": "target"}}, DIGIT_FIELDS
    )
    error = source_error(ArraysSource, spec)
    assert f"source file {missing} does not exist (working directory {os.getcwd()})" in str(error)


def test_arrays_missing_npy_column_names_that_file(tmp_path: Path):
    images = tmp_path / "images.npy"
    np.save(images, np.zeros((3, 8, 8), dtype=np.uint8))
    spec = make_spec(
        {"kind": "arrays", "columns": {"image": str(images), "label": str(tmp_path / "labels.npy")}}, DIGIT_FIELDS
    )
    assert f"source file {tmp_path / 'labels.npy'} does not exist" in str(source_error(ArraysSource, spec))


def test_arrays_npz_without_the_named_key_is_an_error(digits_npz: Path):
    spec = make_spec(
        {"kind": "arrays", "path": str(digits_npz), "columns": {"image": "images", "label": "labels"}}, DIGIT_FIELDS
    )
    error = source_error(ArraysSource, spec)
    assert f"{digits_npz} has no array 'labels'" in str(error)


# --- image folder --------------------------------------------------------------------------------


def folder_spec(root) -> DatasetSpec:
    return make_spec({"kind": "image_folder", "root": str(root)}, FOLDER_FIELDS, name="photos")


def test_image_folder_lists_sorted_classes_with_labels(photo_folder: Path):
    photos = colour_photos()
    source = ImageFolderSource(folder_spec(photo_folder))
    assert source.classes == ["astronaut", "coffee"]
    assert len(source) == 6
    assert [label for _, label in source.items] == [0, 0, 0, 1, 1, 1]
    assert source.files == [str(photo_folder / c / f"{k}.png") for c in ("astronaut", "coffee") for k in range(3)]
    image, label = source[4]
    assert label == 1
    assert image.mode == "RGB"
    assert np.array_equal(np.asarray(image), crops(photos["coffee"], size=64, count=3)[1])
    assert source.sample_sizes().tolist() == [os.path.getsize(f) for f in source.files]


def test_image_folder_class_order_does_not_depend_on_creation_order(tmp_path: Path):
    photo = colour_photos()["chelsea"][:32, :32]
    for name in ("zebra", "apple", "mango"):  # created out of order
        (tmp_path / "r" / name).mkdir(parents=True)
        Image.fromarray(photo).save(tmp_path / "r" / name / "x.png")
    source = ImageFolderSource(folder_spec(tmp_path / "r"))
    assert source.classes == ["apple", "mango", "zebra"]
    assert [rel for rel, _ in source.items] == ["apple/x.png", "mango/x.png", "zebra/x.png"]


def test_image_folder_ignores_non_image_and_hidden_files(photo_folder: Path):
    (photo_folder / "astronaut" / "notes.txt").write_text("not an image")
    (photo_folder / "astronaut" / ".hidden.png").write_bytes((photo_folder / "astronaut" / "0.png").read_bytes())
    (photo_folder / "README.md").write_text("top-level files are not classes")
    (photo_folder / ".cache").mkdir()
    (photo_folder / ".cache" / "x.png").write_bytes((photo_folder / "astronaut" / "0.png").read_bytes())
    (photo_folder / "coffee" / "UPPER.PNG").write_bytes((photo_folder / "coffee" / "0.png").read_bytes())
    source = ImageFolderSource(folder_spec(photo_folder))
    assert source.classes == ["astronaut", "coffee"]
    rels = [rel for rel, _ in source.items]
    assert rels == [
        "astronaut/0.png",
        "astronaut/1.png",
        "astronaut/2.png",
        "coffee/0.png",
        "coffee/1.png",
        "coffee/2.png",
        "coffee/UPPER.PNG",
    ]


def test_image_folder_missing_root_is_a_source_error(tmp_path: Path):
    error = source_error(ImageFolderSource, folder_spec(tmp_path / "no_such_folder"))
    assert f"image folder {tmp_path / 'no_such_folder'} does not exist" in str(error)


def test_image_folder_without_images_is_a_source_error(tmp_path: Path):
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    (tmp_path / "empty" / "cls" / "a.txt").write_text("x")
    error = source_error(ImageFolderSource, folder_spec(tmp_path / "empty"))
    assert "has no images in class sub-folders" in str(error)


def test_undecodable_image_is_a_sample_error_naming_the_file(photo_folder: Path):
    bad = photo_folder / "coffee" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n but not really a png")
    source = ImageFolderSource(folder_spec(photo_folder))
    index = [rel for rel, _ in source.items].index("coffee/broken.png")
    with pytest.raises(SampleError) as info:
        source[index]
    error = info.value
    assert (error.dataset, error.field, error.index) == ("photos", "image", index)
    assert f"cannot decode {bad}" in str(error)
    assert f"dataset 'photos', field 'image', sample index {index}" in str(error)
    source[0]  # the other images still load


def test_truncated_image_is_a_sample_error(photo_folder: Path):
    good = photo_folder / "astronaut" / "1.png"
    good.write_bytes(good.read_bytes()[:200])
    source = ImageFolderSource(folder_spec(photo_folder))
    with pytest.raises(SampleError, match=f"cannot decode {good}"):
        source[1]


# --- python factories ----------------------------------------------------------------------------


def python_spec(factory: str, args: dict | None = None, fields: dict | None = None, name: str = "tab") -> DatasetSpec:
    source = {"kind": "python", "factory": factory}
    if args is not None:
        source["args"] = args
    return make_spec(source, fields or {"x": {"type": "float"}, "y": {"type": "int"}}, name=name)


def test_python_factory_is_imported_from_the_working_directory(workdir: Path):
    write_module(
        workdir,
        "bb_wine_adapter.py",
        """\
        from sklearn.datasets import load_wine

        def make(limit):
            wine = load_wine()
            return [(float(x[0]), int(y)) for x, y in zip(wine.data[:limit], wine.target[:limit])]
        """,
    )
    spec = python_spec("bb_wine_adapter:make", {"limit": 20})
    source = open_source(spec)
    assert isinstance(source, PythonSource)
    from sklearn.datasets import load_wine

    wine = load_wine()
    assert len(source) == 20
    assert source[3] == (float(wine.data[3][0]), int(wine.target[3]))
    assert adapter_files(spec) == ["bb_wine_adapter.py"]
    assert source.sample_sizes() is None


def test_python_factory_in_a_package_lists_the_module_file(workdir: Path):
    write_module(workdir, "bb_userpkg/__init__.py", "")
    write_module(workdir, "bb_userpkg/tables.py", "def make():\n    return [(0.5, 1)]\n")
    spec = python_spec("bb_userpkg.tables:make")
    assert PythonSource(spec)[0] == (0.5, 1)
    assert adapter_files(spec) == [os.path.join("bb_userpkg", "tables.py")]
    assert input_files(spec) == [os.path.join("bb_userpkg", "tables.py")]


def test_adapter_files_are_found_without_running_the_module(workdir: Path):
    write_module(workdir, "bb_noisy.py", "raise RuntimeError('must not be imported by adapter_files')\n")
    assert adapter_files(python_spec("bb_noisy:make")) == ["bb_noisy.py"]


def test_missing_module_error_names_module_and_factory(workdir: Path):
    error = source_error(PythonSource, python_spec("bb_no_such_module:make"))
    assert str(error) == (
        "dataset 'tab': cannot import module 'bb_no_such_module' of factory bb_no_such_module:make: "
        "ModuleNotFoundError: No module named 'bb_no_such_module'"
    )


def test_module_that_fails_to_import_is_a_source_error(workdir: Path):
    write_module(workdir, "bb_broken_syntax.py", "def make(:\n")
    error = source_error(PythonSource, python_spec("bb_broken_syntax:make"))
    assert "cannot import module 'bb_broken_syntax' of factory bb_broken_syntax:make: SyntaxError" in str(error)


def test_missing_factory_attribute_is_a_source_error(workdir: Path):
    write_module(workdir, "bb_no_attr.py", "def other():\n    return []\n")
    error = source_error(PythonSource, python_spec("bb_no_attr:make"))
    assert str(error) == "dataset 'tab': module 'bb_no_attr' has no attribute 'make'"


def test_factory_that_raises_is_a_source_error(workdir: Path):
    write_module(workdir, "bb_raises.py", "def make(path):\n    raise FileNotFoundError(f'no table at {path}')\n")
    error = source_error(PythonSource, python_spec("bb_raises:make", {"path": "t.csv"}))
    assert str(error) == "dataset 'tab': factory bb_raises:make raised FileNotFoundError: no table at t.csv"
    assert isinstance(error.__cause__, FileNotFoundError)


def test_factory_called_with_wrong_args_is_a_source_error(workdir: Path):
    write_module(workdir, "bb_args.py", "def make(n):\n    return list(range(n))\n")
    error = source_error(PythonSource, python_spec("bb_args:make", {"m": 3}))
    assert "factory bb_args:make raised TypeError" in str(error)


def test_factory_returning_an_object_without_len_is_a_source_error(workdir: Path):
    write_module(workdir, "bb_gen.py", "def make():\n    return (i for i in range(3))\n")
    error = source_error(PythonSource, python_spec("bb_gen:make"))
    assert str(error) == (
        "dataset 'tab': factory bb_gen:make returned a generator, which lacks __len__ and __getitem__"
    )


# --- input files and fingerprints ----------------------------------------------------------------


def test_input_files_of_a_python_source_is_the_users_module_relative_to_cwd(workdir: Path):
    write_module(workdir, "bb_inputs_adapter.py", "def make():\n    return [(1.0, 2)]\n")
    spec = python_spec("bb_inputs_adapter:make")
    assert input_files(spec) == ["bb_inputs_adapter.py"]
    assert os.path.isfile(input_files(spec)[0])


def test_input_files_of_arrays_are_their_files_in_field_order(tmp_path: Path, digits_npz: Path):
    npz = make_spec(
        {"kind": "arrays", "path": str(digits_npz), "columns": {"image": "images", "label": "target"}}, DIGIT_FIELDS
    )
    assert input_files(npz) == [str(digits_npz)]
    npy = make_spec({"kind": "arrays", "columns": {"label": "l.npy", "image": "i.npy"}}, DIGIT_FIELDS)
    assert input_files(npy) == ["i.npy", "l.npy"]
    assert adapter_files(npy) == []


def test_an_image_folder_has_no_input_per_image(photo_folder: Path):
    """Tracked through its file list instead (tests/unit/sources/test_folder_listing.py)."""
    assert input_files(folder_spec(photo_folder)) == []


def test_fingerprint_changes_when_a_files_content_changes(tmp_path: Path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"first file")
    b.write_bytes(b"second file")
    before = fingerprint_files([str(a), str(b)])
    assert before["files"] == 2 and before["bytes"] == len(b"first file") + len(b"second file")
    assert len(before["sha256"]) == 64
    assert fingerprint_files([str(a), str(b)]) == before
    b.write_bytes(b"second fild")  # same size, one byte differs
    after = fingerprint_files([str(a), str(b)])
    assert after["bytes"] == before["bytes"]
    assert after["sha256"] != before["sha256"]


def test_fingerprint_depends_on_file_paths_and_order(tmp_path: Path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"same")
    b.write_bytes(b"same")
    assert fingerprint_files([str(a)])["sha256"] != fingerprint_files([str(b)])["sha256"]
    assert fingerprint_files([str(a), str(b)])["sha256"] != fingerprint_files([str(b), str(a)])["sha256"]


def test_fingerprint_of_real_image_files_follows_an_edit(photo_folder: Path):
    spec = folder_spec(photo_folder)
    before = open_source(spec).inputs_fingerprint()
    target = photo_folder / "coffee" / "2.png"
    pixels = np.asarray(Image.open(target)).copy()
    pixels[0, 0] ^= 1
    Image.fromarray(pixels).save(target)
    assert open_source(spec).inputs_fingerprint()["sha256"] != before["sha256"]


def test_sha256_file_matches_hashlib(tmp_path: Path):
    import hashlib

    path = tmp_path / "x.bin"
    data = os.urandom(3 << 20)  # more than one read chunk
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_custom_field_class_modules_are_adapter_files_but_betonbuilds_own_are_not(workdir: Path):
    write_module(workdir, "bb_tagfield.py", "from betonbuild.custom import FixedUTF8Field as TagField\n")
    spec = make_spec(
        {"kind": "arrays", "path": "x.npz", "columns": {"a": "a", "b": "b", "y": "y"}},
        {
            "a": {"type": "custom", "class": "bb_tagfield:TagField", "args": {"width": 4}},
            "b": {"type": "custom", "class": "betonbuild.custom:FixedUTF8Field", "args": {"width": 4}},
            "y": {"type": "int"},
        },
        name="tags",
    )
    assert adapter_files(spec) == ["bb_tagfield.py"]
    assert input_files(spec) == ["x.npz", "bb_tagfield.py"]
