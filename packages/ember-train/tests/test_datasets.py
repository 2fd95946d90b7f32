"""Built-in datasets and the IDX / CSV / image-folder loaders."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from PIL import Image

import ember
from ember_train import datasets as D
from ember_train.data import DataLoader
from ember_train.errors import DatasetFormatError, DatasetNotFoundError


def test_digits_shapes_split_and_normalisation():
    tr, va = D.digits("train"), D.digits("valid")
    assert len(tr) + len(va) == 1797
    assert len(va) == pytest.approx(0.2 * 1797, abs=10)
    x, y = tr[0]
    assert x.shape == (1, 28, 28) and x.dtype == np.float32 and y.dtype == np.int64
    xs = tr.arrays[0]
    assert abs(float(xs.mean())) < 1e-4 and float(xs.std()) == pytest.approx(1.0, abs=1e-4)
    # valid uses the train statistics, so it is only roughly standardised
    assert va.mean == tr.mean and va.std == tr.std
    assert set(np.unique(tr.arrays[1]).tolist()) == set(range(10)) == set(np.unique(va.arrays[1]).tolist())
    # de-normalised pixels lie in [0, 1]
    raw = xs * tr.std + tr.mean
    assert raw.min() >= -1e-5 and raw.max() <= 1 + 1e-5
    # stratified: every class's share of valid is close to valid_fraction
    counts_tr = np.bincount(tr.arrays[1], minlength=10)
    counts_va = np.bincount(va.arrays[1], minlength=10)
    np.testing.assert_allclose(counts_va / (counts_tr + counts_va), 0.2, atol=0.01)
    # seeded: same seed same split, another seed another split
    np.testing.assert_array_equal(D.digits("valid").arrays[0], va.arrays[0])
    assert not np.array_equal(D.digits("valid", seed=1).arrays[0], va.arrays[0])
    b = DataLoader(tr, batch_size=32, shuffle=True, seed=0).check()
    assert tuple(b[0].shape) == (32, 1, 28, 28) and b[0].dtype == ember.float32 and b[1].dtype == ember.int64


def test_digits_size8_matches_sklearn_up_to_scale():
    from sklearn.datasets import load_digits

    d = load_digits()
    tr = D.digits("train", size=8, valid_fraction=0.5)
    va = D.digits("valid", size=8, valid_fraction=0.5)
    pool = {tuple(np.round(im.ravel() / 16.0, 5)) for im in d.images}
    back = np.round(tr.arrays[0].reshape(len(tr), 64) * tr.std + tr.mean, 5)
    assert sum(tuple(r) in pool for r in back[:50]) == 50
    assert len(tr) + len(va) == 1797


def test_digits_bad_args():
    with pytest.raises(ember.ValueRangeError, match="split"):
        D.digits("test")
    with pytest.raises(ember.ValueRangeError, match="valid_fraction"):
        D.digits(valid_fraction=1.5)


def test_synthetic_regression_is_linear():
    ds = D.synthetic_regression(n=500, features=4, noise=0.0, seed=3)
    x, y = ds.arrays
    assert x.shape == (500, 4) and y.shape == (500, 1) and x.dtype == y.dtype == np.float32
    np.testing.assert_allclose(x @ ds.weight + ds.bias, y[:, 0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(D.synthetic_regression(500, 4, 0.0, 3).arrays[0], x)


def test_synthetic_sequences_are_learnable():
    ds = D.synthetic_sequences(n=300, seq_len=16, vocab=40, classes=4, seed=0)
    tok, lab = ds.arrays
    assert tok.shape == (300, 16) and tok.dtype == np.int64 and lab.dtype == np.int64
    assert tok.min() >= 1 and tok.max() < 40 and set(lab.tolist()) == {0, 1, 2, 3}
    # the markers present decide the label exactly
    for t, c in zip(tok, lab):
        owners = {k for k in range(4) if np.isin(t, ds.markers[k]).any()}
        assert owners == {int(c)}
    with pytest.raises(ember.ValueRangeError):
        D.synthetic_sequences(vocab=4, classes=4)


@pytest.mark.parametrize("name", ["imgs.idx", "imgs.idx.gz"])
def test_idx_round_trip_and_mnist(tmp_path, name):
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, size=(5, 4, 3), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5], np.uint8)
    D.write_idx(tmp_path / name, imgs)
    D.write_idx(tmp_path / "lab.idx", labels)
    raw = (tmp_path / name).read_bytes()
    if name.endswith(".gz"):
        raw = gzip.decompress(raw)
    assert raw[:4] == b"\x00\x00\x08\x03" and raw[4:8] == (5).to_bytes(4, "big")
    np.testing.assert_array_equal(D.read_idx(tmp_path / name), imgs)
    ds = D.mnist_idx(tmp_path / name, tmp_path / "lab.idx")
    x, y = ds[2]
    assert x.shape == (1, 4, 3) and x.dtype == np.float32 and y == 4 and y.dtype == np.int64
    np.testing.assert_allclose(x[0], imgs[2] / 255.0, rtol=1e-6)
    f = np.linspace(-1, 1, 6).reshape(2, 3)
    D.write_idx(tmp_path / "f.idx", f)
    np.testing.assert_array_equal(D.read_idx(tmp_path / "f.idx"), f)


def test_idx_errors(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="missing.idx"):
        D.read_idx(tmp_path / "missing.idx")
    (tmp_path / "bad.idx").write_bytes(b"\x12\x34\x56\x78rest")
    with pytest.raises(DatasetFormatError, match="not an IDX file"):
        D.read_idx(tmp_path / "bad.idx")
    (tmp_path / "short.idx").write_bytes(b"\x00\x00\x08\x01" + (10).to_bytes(4, "big") + b"abc")
    with pytest.raises(DatasetFormatError, match="need 10 data bytes, found 3"):
        D.read_idx(tmp_path / "short.idx")
    D.write_idx(tmp_path / "i.idx", np.zeros((4, 2, 2), np.uint8))
    D.write_idx(tmp_path / "l.idx", np.zeros(3, np.uint8))
    with pytest.raises(DatasetFormatError, match="match 4 images"):
        D.mnist_idx(tmp_path / "i.idx", tmp_path / "l.idx")
    with pytest.raises(DatasetFormatError, match="no IDX type"):
        D.write_idx(tmp_path / "x.idx", np.zeros(2, np.int64))
    assert issubclass(DatasetNotFoundError, FileNotFoundError) and issubclass(DatasetNotFoundError, ember.EmberError)


@pytest.mark.parametrize("dims", [(-2, -2), (-1, 4), (2, -3)])
def test_idx_negative_dims_are_a_format_error(tmp_path, dims):
    # (-2, -2) multiplies to 4, matching the data: only an explicit check stops numpy's reshape ValueError
    data = bytes([0, 0, 0x08, len(dims)]) + np.asarray(dims, ">i4").tobytes() + bytes(4)
    path = tmp_path / "neg.idx"
    path.write_bytes(data)
    with pytest.raises(DatasetFormatError, match=r"neg\.idx.*negative dimension") as info:
        D.read_idx(path)
    assert isinstance(info.value, ValueError) and isinstance(info.value, ember.EmberError)


def test_idx_huge_dims_do_not_wrap(tmp_path):
    # 2**31-1 squared times 4 overflows int64 arithmetic in numpy; the size check must still refuse cleanly
    path = tmp_path / "huge.idx"
    path.write_bytes(bytes([0, 0, 0x0D, 3]) + np.asarray([2**31 - 1] * 3, ">i4").tobytes() + bytes(8))
    with pytest.raises(DatasetFormatError, match=r"huge\.idx.*data bytes, found 8"):
        D.read_idx(path)


def test_csv_regression_and_classification(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("a,b,label,y\n1,2,cat,0.5\n3,4,dog,1.5\n5,6,cat,2.5\n\n")
    with pytest.raises(DatasetFormatError, match=r"line 2 column 'label': 'cat' is not a number"):
        D.csv_dataset(p, "y")
    q = tmp_path / "c.csv"
    q.write_text("x1,x2,cls\n0.5,1,10\n1.5,2,2\n2.5,3,10\n")
    c = D.csv_dataset(q, "cls", task="classification")
    assert c.classes == ["2", "10"]  # numeric labels sort numerically
    assert c.arrays[1].tolist() == [1, 0, 1] and c.arrays[1].dtype == np.int64
    assert c.arrays[0].dtype == np.float32 and c.feature_names == ["x1", "x2"]
    r = D.csv_dataset(q, "x2")
    x, y = r[1]
    assert x.tolist() == [1.5, 2.0] and y.shape == (1,) and y.dtype == np.float32 and y[0] == 2.0
    s = tmp_path / "s.csv"
    s.write_text("f,animal\n1,dog\n2,cat\n3,dog\n")
    sc = D.csv_dataset(s, "animal", task="classification")
    assert sc.classes == ["cat", "dog"] and sc.arrays[1].tolist() == [1, 0, 1]
    with pytest.raises(DatasetFormatError, match=r"no column 'nope'; columns: \['f', 'animal'\]"):
        D.csv_dataset(s, "nope")
    with pytest.raises(DatasetFormatError, match="'dog' is not a number"):
        D.csv_dataset(s, "animal")
    with pytest.raises(DatasetNotFoundError, match="CSV file not found at .*none.csv"):
        D.csv_dataset(tmp_path / "none.csv", "y")
    (tmp_path / "ragged.csv").write_text("a,b\n1,2\n3\n")
    with pytest.raises(DatasetFormatError, match="line 3 has 1 fields"):
        D.csv_dataset(tmp_path / "ragged.csv", "b")
    with pytest.raises(ember.ValueRangeError, match="task"):
        D.csv_dataset(s, "animal", task="ranking")


def _png(path, arr, mode):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr, mode=mode).save(path)


def test_image_folder(tmp_path):
    root = tmp_path / "imgs"
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, size=(6, 5, 3), dtype=np.uint8)
    _png(root / "zebra" / "1.png", a, "RGB")
    _png(root / "ant" / "b.png", a, "RGB")
    _png(root / "ant" / "a.png", a, "RGB")
    (root / "ant" / "notes.txt").write_text("not an image")
    ds = D.image_folder(root)
    assert ds.classes == ["ant", "zebra"] and len(ds) == 3
    assert [p.name for p, _ in ds.samples] == ["a.png", "b.png", "1.png"]
    x, y = ds[2]
    assert x.shape == (3, 6, 5) and x.dtype == np.float32 and int(y) == 1
    np.testing.assert_allclose(x, a.transpose(2, 0, 1) / 255.0, rtol=1e-6)
    small = D.image_folder(root, size=4)
    assert small[0][0].shape == (3, 4, 4)
    g = tmp_path / "gray"
    _png(g / "0" / "x.png", a[..., 0], "L")
    gx, _ = D.image_folder(g)[0]
    assert gx.shape == (1, 6, 5)
    assert D.image_folder(g, mode="RGB")[0][0].shape == (3, 6, 5)
    b = DataLoader(small, batch_size=3, num_workers=2).check()
    assert tuple(b[0].shape) == (3, 3, 4, 4) and b[1].numpy().tolist() == [0, 0, 1]


def test_image_folder_errors(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=r"image folder \(root/<class>/<image files>\) not found at .*nope"):
        D.image_folder(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetFormatError, match="no class subfolders"):
        D.image_folder(tmp_path / "empty")
    (tmp_path / "empty" / "cls").mkdir()
    with pytest.raises(DatasetFormatError, match="no image files"):
        D.image_folder(tmp_path / "empty")
    (tmp_path / "empty" / "cls" / "broken.png").write_bytes(b"not a png")
    ds = D.image_folder(tmp_path / "empty")
    with pytest.raises(DatasetFormatError, match="cannot read image .*broken.png"):
        ds[0]
