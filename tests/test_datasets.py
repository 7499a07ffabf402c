"""``slurmtf data``: the real-digit MNIST sample, manifests, atomic writes, fetching.

Fetching runs the real download code against a ``http.server`` on 127.0.0.1 serving
files these tests write, with their own checksums in place of the published ones.
No TensorFlow: the IDX and CIFAR readers' file checks are plain Python.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import io
import json
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from models.data import cifar
from models.data import mnist as mnist_reader
from slurmtf import cli as slurmtf_cli
from slurmtf.cli import data as cli
from slurmtf.datasets import fetch, manifest, sample
from slurmtf.errors import InputError
from tests.helpers.datafiles import have_sklearn
from tests.prereqs import require

REPO = Path(__file__).resolve().parents[1]


def tiny_digits(n: int = sample.NUM_TRAIN + 40) -> tuple[np.ndarray, np.ndarray, str]:
    """Stand-in for load_digits (same shapes and range) for tests about the writing."""
    rng = np.random.default_rng(3)
    return rng.integers(0, 17, (n, 8, 8)).astype(np.uint8), np.arange(n) % 10, "test"


@pytest.fixture(scope="module")
def real_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(have_sklearn(), "scikit-learn (pip install 'slurmtf[data]')")
    out = tmp_path_factory.mktemp("sample")
    assert cli.main(["sample-mnist", str(out)]) == 0
    return out


# ------------------------------------------------------------------ the sample


def test_sample_is_real_digits_in_mnist_format_with_a_fixed_split(real_sample: Path) -> None:
    train_x, train_y = mnist_reader.load(str(real_sample), True)
    test_x, test_y = mnist_reader.load(str(real_sample), False)
    assert train_x.shape == (1437, 28, 28)
    assert test_x.shape == (360, 28, 28)
    assert train_x.dtype == np.uint8
    assert train_x.max() == 255
    assert np.bincount(train_y).min() >= 140
    assert np.bincount(test_y).min() >= 33
    assert mnist_reader.num_examples(str(real_sample), False) == 360
    # MNIST's layout: ink only inside the central 20x20 box
    assert not train_x[:, :4].any()
    assert not train_x[:, 24:].any()
    assert not train_x[:, :, :4].any()
    # the split is the digits' own order: the first train image is load_digits' first digit
    from sklearn.datasets import load_digits

    digits = load_digits()
    assert train_y[:10].tolist() == digits.target[:10].tolist()
    assert test_y.tolist() == digits.target[1437:].tolist()
    record = json.loads((real_sample / manifest.NAME).read_text())
    assert "UCI" in record["source"]
    assert "load_digits" in record["source"]
    assert record["licence"].startswith("CC BY 4.0")
    assert sorted(record["files"]) == sorted(p.name for p in real_sample.glob("*.gz"))


# SHA-256 of the sample's IDX content (uncompressed: gzip's bytes vary with the zlib build).
# The conversion is integer arithmetic, so these hold on every machine; a change here
# means the sample changed and the accuracies recorded in docs/MODELS.md need a rerun.
SAMPLE_IDX_SHA256 = {
    "train-images": "bb12b77c83598f238508d620c0830fd87b27c81576e5665390c9c57791d9628b",
    "train-labels": "f8a600b73e2c056aa42316260206e6643bd33e96bd71cfb8e32b94f76fac4f93",
    "t10k-images": "8f997afcc5865de2b8e2158337b3cd98b5213c3ff940936aca674150141d4d61",
    "t10k-labels": "cf2c8a23974df0c99eb3f36ff34c02acb9be1c84aca7280211ef04bea1135360",
}


def test_sample_content_is_pinned(real_sample: Path) -> None:
    for stem, digest in SAMPLE_IDX_SHA256.items():
        ndim = 3 if stem.endswith("images") else 1
        content = gzip.decompress((real_sample / f"{stem}-idx{ndim}-ubyte.gz").read_bytes())
        assert hashlib.sha256(content).hexdigest() == digest, stem


def test_sample_bytes_are_the_same_every_time(real_sample: Path, tmp_path: Path) -> None:
    assert cli.main(["sample-mnist", str(tmp_path)]) == 0
    for path in real_sample.glob("*.gz"):
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), path.name
    assert (tmp_path / manifest.NAME).read_text() == (real_sample / manifest.NAME).read_text()


def test_digits_are_scaled_into_the_central_box() -> None:
    full = np.full((1, 8, 8), 16, np.uint8)
    out = sample.to_mnist_images(full)[0]
    assert (out[4:24, 4:24] == 255).all()
    assert out.sum() == 255 * 400
    corner = np.zeros((1, 8, 8), np.uint8)
    corner[0, 0, 0] = 16
    out = sample.to_mnist_images(corner)[0]
    assert out[4, 4] == 255
    assert out[4:7, 4:7].min() > 0
    assert not out[10:].any()


def test_sample_without_scikit_learn_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "sklearn", None)  # makes `import sklearn` fail
    with pytest.raises(InputError, match=r"scikit-learn.*HINT: pip install \"slurmtf\[data\]\""):
        sample.write_mnist_sample(tmp_path)
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------ manifests


def test_reader_refuses_a_file_that_does_not_match_the_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample.write_mnist_sample(tmp_path, tiny_digits())
    labels = tmp_path / "t10k-labels-idx1-ubyte.gz"
    raw = bytearray(gzip.decompress(labels.read_bytes()))
    raw[-1] = (raw[-1] + 1) % 10  # one wrong label, still a valid IDX file
    labels.write_bytes(gzip.compress(bytes(raw)))
    with pytest.raises(InputError) as err:
        mnist_reader.load(str(tmp_path), False)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{labels}='sha256:")
    assert "does not match" in message
    assert "HINT: " in message
    mnist_reader.load(str(tmp_path), True)  # the other split is intact
    assert cli.main(["verify", str(tmp_path)]) == 2
    assert "t10k-labels-idx1-ubyte.gz" in capsys.readouterr().err


def test_reader_refuses_files_the_manifest_does_not_list(tmp_path: Path) -> None:
    sample.write_mnist_sample(tmp_path, tiny_digits())
    gz = tmp_path / "train-images-idx3-ubyte.gz"
    (tmp_path / "train-images-idx3-ubyte").write_bytes(gzip.decompress(gz.read_bytes()))
    with pytest.raises(InputError, match=r"is not listed in .*HINT: use the files"):
        mnist_reader.load(str(tmp_path), True)


def test_a_linked_data_file_is_checked_under_its_own_name(tmp_path: Path) -> None:
    sample.write_mnist_sample(tmp_path / "data", tiny_digits())
    stored = tmp_path / "store" / "labels.gz"
    stored.parent.mkdir()
    labels = tmp_path / "data" / "t10k-labels-idx1-ubyte.gz"
    labels.replace(stored)
    labels.symlink_to(stored)
    assert len(mnist_reader.load(str(tmp_path / "data"), False)[1]) == 40


def test_files_without_a_manifest_are_read_unchecked(tmp_path: Path) -> None:
    sample.write_mnist_sample(tmp_path, tiny_digits())
    (tmp_path / manifest.NAME).unlink()
    assert mnist_reader.load(str(tmp_path), False)[0].shape == (40, 28, 28)


def test_a_parent_manifest_covers_only_the_folders_it_lists(tmp_path: Path) -> None:
    (tmp_path / "cifar-10-batches-bin").mkdir()
    batch = tmp_path / "cifar-10-batches-bin" / "test_batch.bin"
    batch.write_bytes(b"x" * cifar.RECORD_BYTES)
    digest = hashlib.sha256(batch.read_bytes()).hexdigest()
    listed = {"cifar-10-batches-bin/test_batch.bin": digest}
    manifest.write(tmp_path, manifest.Manifest("cifar10", "d", "s", "l", listed))
    sample.write_mnist_sample(tmp_path / "mnist", tiny_digits())
    (tmp_path / "mnist" / manifest.NAME).unlink()  # the user's own files, beside CIFAR-10
    assert mnist_reader.load(str(tmp_path / "mnist"), True)[0].shape == (1437, 28, 28)
    assert cifar.files(str(tmp_path), False) == [str(batch)]
    batch.write_bytes(b"y" * cifar.RECORD_BYTES)
    with pytest.raises(InputError, match="does not match"):
        cifar.files(str(tmp_path), False)


@pytest.mark.parametrize(
    "text", ["{", '{"format": "other/9", "files": {}}', '{"format": "slurmtf-data-manifest/1"}']
)
def test_malformed_manifest_is_a_one_line_error(tmp_path: Path, text: str) -> None:
    sample.write_mnist_sample(tmp_path, tiny_digits())
    (tmp_path / manifest.NAME).write_text(text)
    with pytest.raises(InputError, match=r"is not a slurmtf-data-manifest/1 manifest.*HINT"):
        mnist_reader.load(str(tmp_path), True)


def test_atomic_write_leaves_nothing_when_interrupted(tmp_path: Path) -> None:
    target = tmp_path / "data.bin"
    target.write_bytes(b"old")

    def chunks() -> Iterator[bytes]:
        yield b"new, half"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        manifest.atomic_write(target, chunks())
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["data.bin"]
    manifest.atomic_write(tmp_path / "sub" / "new.bin", [b"a", b"b"])
    assert (tmp_path / "sub" / "new.bin").read_bytes() == b"ab"


# ------------------------------------------------------------------ fetching


class _Server:
    """A static file server on 127.0.0.1 that counts the requests it answers."""

    def __init__(self, root: Path) -> None:
        self.requests: list[str] = []
        outer = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                outer.requests.append(self.path)

        handler = functools.partial(Handler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/files/"
        # A short poll interval: shutdown() waits for one poll (0.5 s by default).
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[_Server, Path]]:
    root = tmp_path / "www"
    (root / "files").mkdir(parents=True)
    srv = _Server(root)
    yield srv, root / "files"
    srv.close()


def _remotes(folder: Path) -> tuple[fetch.Remote, ...]:
    return tuple(
        fetch.Remote(p.name, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(folder.iterdir())
    )


def test_fetch_mnist_downloads_verifies_and_the_reader_checks(
    server: tuple[_Server, Path], tmp_path: Path
) -> None:
    srv, files = server
    sample.write_mnist_sample(files, tiny_digits())
    (files / manifest.NAME).unlink()  # the mirror serves the four IDX files only
    remotes = _remotes(files)
    out = tmp_path / "mnist"
    lines: list[str] = []
    fetch.fetch("mnist", out, mirror=srv.url, files=remotes, log=lines.append)
    for remote in remotes:
        assert (out / remote.name).read_bytes() == (files / remote.name).read_bytes()
    assert mnist_reader.load(str(out), True)[0].shape == (1437, 28, 28)
    record = manifest.verify_directory(out)
    assert record["name"] == "mnist"
    assert record["mirrors"] == [srv.url]
    assert len(srv.requests) == 4
    fetch.fetch("mnist", out, mirror=srv.url, files=remotes, log=lines.append)
    assert len(srv.requests) == 4  # already there with the right checksum: not fetched again
    assert sum("already here" in line for line in lines) == 4


def test_fetch_refuses_wrong_bytes_and_keeps_none(
    server: tuple[_Server, Path], tmp_path: Path
) -> None:
    srv, files = server
    (files / "train-images-idx3-ubyte.gz").write_bytes(b"not the published file")
    published = fetch.MNIST.files[:1]  # the real constants: this file cannot match them
    with pytest.raises(InputError) as err:
        fetch.fetch("mnist", tmp_path / "out", mirror=srv.url, files=published, log=print)
    message = str(err.value)
    assert message.startswith(f"--mirror='{srv.url}train-images-idx3-ubyte.gz'")
    assert "expected 9,912,422 bytes with sha256 440fcabf73cc546f" in message
    assert "HINT" in message
    assert not (tmp_path / "out" / "train-images-idx3-ubyte.gz").exists()
    assert list((tmp_path / "out").iterdir()) == []  # no temporary file left either


def test_fetch_missing_file_names_each_url_tried(
    server: tuple[_Server, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    srv, _ = server
    status = slurmtf_cli.main(["data", "fetch", "mnist", str(tmp_path), f"--mirror={srv.url}"])
    err = capsys.readouterr().err
    assert status == 1
    assert f"{srv.url}train-images-idx3-ubyte.gz: HTTP 404 File not found" in err
    assert "HINT: " in err


def _cifar_archive(path: Path, per_file: int = 3) -> None:
    """A cifar-10-binary.tar.gz with tiny record files and members to be skipped."""
    rng = np.random.default_rng(5)
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    with tarfile.open(path, "w:gz") as tar:
        for name in [*names, "../escape.bin"]:
            data = rng.integers(0, 256, per_file * cifar.RECORD_BYTES, dtype=np.uint8).tobytes()
            member = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        link = tarfile.TarInfo("cifar-10-batches-bin/link.bin")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)


def test_fetch_cifar10_unpacks_regular_files_and_the_reader_checks(
    server: tuple[_Server, Path], tmp_path: Path
) -> None:
    srv, files = server
    _cifar_archive(files / "cifar-10-binary.tar.gz")
    out = tmp_path / "cifar"
    fetch.fetch("cifar10", out, mirror=srv.url, files=_remotes(files), log=print)
    extracted = sorted(p.name for p in (out / "cifar-10-batches-bin").iterdir())
    assert extracted == [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    assert not (tmp_path / "escape.bin").exists()
    assert not (out / "escape.bin").exists()
    assert cifar.num_examples(str(out), True) == 15
    assert cifar.num_examples(str(out), False) == 3
    batch = out / "cifar-10-batches-bin" / "data_batch_2.bin"
    batch.write_bytes(bytes(batch.stat().st_size))  # same size, other bytes
    with pytest.raises(InputError, match=r"data_batch_2\.bin='sha256:.*does not match.*HINT"):
        cifar.files(str(out), True)


def test_published_checksums_are_well_formed() -> None:
    for data_set in fetch.DATA_SETS.values():
        for remote in data_set.files:
            assert len(remote.sha256) == 64
            assert int(remote.sha256, 16) >= 0
            assert remote.size > 0
        assert all(m.startswith("https://") and m.endswith("/") for m in data_set.mirrors)


# ------------------------------------------------------------------ CLI and imports


def test_import_slurmtf_and_the_data_cli_import_neither_sklearn_nor_tensorflow() -> None:
    code = (
        "import sys, slurmtf, slurmtf.cli, slurmtf.cli.data, slurmtf.datasets.fetch, "
        "slurmtf.datasets.sample, models.data.mnist, models.data.cifar; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'sklearn', 'tensorflow'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("argv", "status", "text"),
    [
        (["data"], 2, "usage: slurmtf data"),
        (["data", "fetch", "imagenet", "x"], 2, "invalid choice: 'imagenet'"),
        (["data", "fetch", "mnist", "x", "--mirror=ftp.example"], 2, "--mirror='ftp.example'"),
    ],
)
def test_data_cli_usage_errors(
    argv: list[str], status: int, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert slurmtf_cli.main(argv) == status
    assert text in capsys.readouterr().err


def test_verify_without_a_manifest_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["verify", str(tmp_path)]) == 2
    assert f"DIR='{tmp_path}': has no MANIFEST.json. HINT:" in capsys.readouterr().err
