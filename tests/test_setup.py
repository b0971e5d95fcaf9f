"""setup.sh's options, the bring-your-own-torch venv (--system-torch, --wheelhouse) over a python that already holds
torch, benchmarks/device_bundle.sh's argument checks, and the lower bounds pyproject.toml claims.

The bring-up over "an image" runs offline: the image is a venv (as the GPU machines' /opt/torch/.venv is one)
that sees the main .venv's packages through a directory of links, and the wheelhouse is empty, so pip can
install nothing: what setup.sh needs must already be there, and what it lacks makes pip fail with setup.sh's
sentence. .ci/lowest_versions.sh runs the full bring-up with a real bundle (it downloads).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from helpers import ROOT

MAIN_SITE = Path(sysconfig.get_paths()["purelib"])


def _setup(cwd: Path, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(cwd / "setup.sh"), *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _lone_setup(tmp_path: Path) -> Path:
    """setup.sh alone in a directory: anything it would create shows up there."""
    shutil.copy(ROOT / "setup.sh", tmp_path / "setup.sh")
    return tmp_path


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--bogus"], {}, "unknown option '--bogus'; expected --system-torch, --wheelhouse DIR or --help."),
        (["--wheelhouse"], {}, "--wheelhouse needs a directory of wheels (e.g. .cache/device_bundle)."),
        (["--wheelhouse", "/nonexistent/wh"], {}, "--wheelhouse '/nonexistent/wh' is not a directory;"),
        ([], {"CHECKFREE_SYSTEM_TORCH": "yes"}, "CHECKFREE_SYSTEM_TORCH is 'yes'; expected 1 or 0."),
        (["--system-torch"], {"PYTHON": "/bin/false"}, "/bin/false has no torch;"),
        ([], {"CHECKFREE_SYSTEM_TORCH": "1", "PYTHON": "/bin/false"}, "/bin/false has no torch;"),
    ],
)
def test_a_wrong_option_is_one_sentence_exit_2_and_nothing_written(tmp_path, args, env, message):
    d = _lone_setup(tmp_path)
    r = _setup(d, *args, **env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(f"setup.sh: {message}") and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stdout == "" and sorted(p.name for p in d.iterdir()) == ["setup.sh"]


@pytest.mark.timeout(60)
def test_a_venv_of_the_other_kind_is_refused_and_left_alone(tmp_path):
    d = _lone_setup(tmp_path)
    (d / ".venv").mkdir()
    cfg = d / ".venv" / "pyvenv.cfg"
    cfg.write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    r = _setup(d, "--system-torch", PYTHON=sys.executable)
    assert (
        r.returncode == 2
        and "setup.sh: .venv holds its own packages (a plain ./setup.sh made it)" in r.stderr
    )
    cfg.write_text("home = /usr/bin\ninclude-system-site-packages = true\n")
    r = _setup(d)
    assert r.returncode == 2 and "setup.sh: .venv was made by ./setup.sh --system-torch" in r.stderr
    assert sorted(p.name for p in (d / ".venv").iterdir()) == ["pyvenv.cfg"]


@pytest.mark.timeout(30)
def test_help_names_every_option():
    r = subprocess.run(["bash", str(ROOT / "setup.sh"), "--help"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0
    for option in (
        "--system-torch",
        "--wheelhouse DIR",
        "CHECKFREE_SYSTEM_TORCH=1",
        "CHECKFREE_WHEELHOUSE=DIR",
    ):
        assert option in r.stdout


def _image(root: Path, lacks: set[str]) -> Path:
    """A venv standing in for the GPU image: the main .venv's packages (less ``lacks`` and checkfree itself),
    through a directory of links whose name ends in site-packages as a real one does. Returns its python."""
    links = root / "links" / "site-packages"
    links.mkdir(parents=True)
    for entry in MAIN_SITE.iterdir():
        stem = re.split(r"[-.]", entry.name, maxsplit=1)[0].lower()
        if stem not in lacks and stem != "checkfree" and not entry.name.startswith("__editable__"):
            (links / entry.name).symlink_to(entry)
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root / "image")], check=True, timeout=120
    )
    purelib = subprocess.run(
        [
            str(root / "image" / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    Path(purelib, "_image.pth").write_text(f"import site; site.addsitedir({str(links)!r})\n")
    return root / "image" / "bin" / "python"


def _checkout(root: Path) -> Path:
    """The files setup.sh installs from: the package, its metadata, the script."""
    tree = root / "tree"
    tree.mkdir()
    for name in ("setup.sh", "pyproject.toml", "requirements.txt", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "checkfree", tree / "checkfree", ignore=shutil.ignore_patterns("__pycache__"))
    return tree


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_system_torch_over_an_image_names_what_it_lacks_then_installs_nothing_it_has_and_never_torch(
    tmp_path,
):
    import torch

    image_py = _image(tmp_path, lacks={"zmq", "pyzmq"})
    tree, wheels = _checkout(tmp_path), tmp_path / "empty-wheelhouse"
    wheels.mkdir()
    r = _setup(tree, "--system-torch", "--wheelhouse", str(wheels), timeout=400, PYTHON=str(image_py))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "pyzmq" in r.stderr  # pip's own message names what it could not find
    assert r.stderr.rstrip().splitlines()[-1] == (
        f"setup.sh: pip could not install checkfree's missing requirements from {wheels} (its message is above); "
        "add the wheels it names with benchmarks/device_bundle.sh DIR NAME==VERSION."
    )

    for entry in MAIN_SITE.iterdir():  # the image gains pyzmq: now it has everything
        if re.split(r"[-.]", entry.name, maxsplit=1)[0].lower() in ("zmq", "pyzmq"):
            (tmp_path / "links" / "site-packages" / entry.name).symlink_to(entry)
    r = _setup(tree, "--system-torch", "--wheelhouse", str(wheels), timeout=400, PYTHON=str(image_py))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"[setup] ready: torch {torch.__version__} (not in .venv) transformers" in r.stdout
    assert "include-system-site-packages = true" in (tree / ".venv" / "pyvenv.cfg").read_text()
    probe = (
        "import sysconfig, torch, zmq, datasets, checkfree; "
        "print(sysconfig.get_paths()['purelib']); print(torch.__file__); print(checkfree.__file__)"
    )
    own, torch_file, checkfree_file = subprocess.run(
        [str(tree / ".venv" / "bin" / "python"), "-c", probe],
        cwd=tmp_path,  # not the checkout: the editable install must find checkfree
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    assert torch_file.startswith(str(tmp_path / "links" / "site-packages")), torch_file  # the image's torch
    assert not any(Path(own).glob("torch*")), sorted(p.name for p in Path(own).iterdir())
    assert checkfree_file == str(tree / "checkfree" / "__init__.py")
    assert "liger-kernel" not in r.stdout  # no triton (a CPU torch): the cuda extra is not installed

    # torch brought triton (a CUDA build, as on the GPU image): the cuda extra goes in, --no-deps, from the wheels
    triton = tmp_path / "links" / "site-packages" / "triton"
    triton.mkdir()
    (triton / "__init__.py").write_text("")
    _wheel(wheels, "liger_kernel", "0.8.5", ["torch>=2.1.2", "triton>=2.3.1"])
    r = _setup(tree, "--system-torch", "--wheelhouse", str(wheels), timeout=200, PYTHON=str(image_py))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[setup] installing liger-kernel>=0.8.5 (the cuda extra; --no-deps" in r.stdout
    assert r.stdout.rstrip().endswith(", liger-kernel 0.8.5")
    again = _setup(tree, "--system-torch", "--wheelhouse", str(wheels), timeout=200, PYTHON=str(image_py))
    assert again.returncode == 0 and "installing" not in again.stdout, again.stdout + again.stderr


def _wheel(directory: Path, name: str, version: str, requires: list[str]) -> Path:
    """A pure-Python wheel of an empty package ``name`` that requires ``requires`` (what pip reads of a wheel)."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(text.encode())}"
        for path, text in files.items()
    ]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, text)
    return path


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_system_torch_installs_datasets_without_its_deps_where_the_images_pyarrow_is_older_than_it_asks(
    tmp_path,
):
    """The GPU image's pyarrow may be older than the bundled datasets asks, and a pyarrow wheel (47 MiB) does not
    fit what a device call carries: datasets goes in with --no-deps, its other requirements and checkfree's as
    usual, and setup.sh says so. Here the wheelhouse's datasets asks for pyarrow>=999."""
    import importlib.metadata

    pyarrow = importlib.metadata.version("pyarrow")
    image_py = _image(tmp_path, lacks={"datasets"})
    tree, wheels = _checkout(tmp_path), tmp_path / "wheelhouse"
    wheels.mkdir()
    _wheel(wheels, "datasets", "5.2.0", ["pyarrow>=999", "dill>=0.3.0", "pytest; extra == 'tests'"])
    r = _setup(tree, "--system-torch", "--wheelhouse", str(wheels), timeout=400, PYTHON=str(image_py))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        f"[setup] the image's pyarrow {pyarrow} is older than datasets 5.2.0 asks (pyarrow>=999) and {wheels} has "
        f"no newer one: datasets goes in with --no-deps over pyarrow {pyarrow} (checkfree's token cache uses its "
        "Dataset.map)\n"
    ) in r.stdout
    assert "[setup] ready: torch" in r.stdout
    probe = "import datasets, importlib.metadata as m; print(datasets.__file__, m.version('pyarrow'))"
    where, version = subprocess.run(
        [str(tree / ".venv" / "bin" / "python"), "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    assert (
        where.startswith(str(tree / ".venv")) and version == pyarrow
    )  # the wheelhouse's datasets, the image's pyarrow


@pytest.mark.timeout(60)
def test_system_torch_refuses_a_torch_below_the_lower_bound(tmp_path):
    import torch

    d = _lone_setup(tmp_path)
    text = (ROOT / "pyproject.toml").read_text()
    (d / "pyproject.toml").write_text(re.sub(r'"torch>=[0-9.]+"', '"torch>=99.1"', text))
    r = _setup(d, "--system-torch", PYTHON=sys.executable)
    assert r.returncode == 2 and r.stderr == (
        f"setup.sh: {sys.executable} holds torch {torch.__version__}; checkfree needs torch>=99.1 (pyproject.toml).\n"
    )
    assert sorted(p.name for p in d.iterdir()) == ["pyproject.toml", "setup.sh"]


def _floors() -> dict[str, str]:
    """pyproject.toml's dependencies, NAME>=VERSION each (as setup.sh and .ci/lowest_versions.sh read them)."""
    block = re.search(r"^dependencies = \[\n(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.M | re.S)[1]
    lines = [line.strip().rstrip(",") for line in block.splitlines() if line.strip()]
    return dict(re.fullmatch(r'"([A-Za-z0-9_.-]+)>=([0-9.]+)"', line).groups() for line in lines)


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("+")[0].split("."))


def test_every_pin_meets_its_lower_bound_and_the_gpu_image_meets_torch_and_transformers():
    """requirements.txt pins what the suite runs on; pyproject.toml's bounds what .ci/lowest_versions.sh runs."""
    floors = _floors()
    pins = dict(
        line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines() if "==" in line
    )
    assert set(floors) <= set(pins), set(floors) - set(pins)
    for name, floor in floors.items():
        assert _version(pins[name]) >= _version(floor), (name, pins[name], floor)
    # The GPU image (docs/gpu.md): torch 2.11.0+cu130, transformers 5.17.0 must be enough.
    assert _version(floors["torch"]) <= (2, 11, 0) and _version(floors["transformers"]) <= (5, 17, 0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["DIR", "pyarrow"], {}, "'pyarrow' is not NAME==VERSION; expected e.g. pyarrow==26.0.1."),
        (["DIR"], {"DEVICE_PYTHON": "3"}, "DEVICE_PYTHON is '3'; expected a CPython version such as 3.12."),
        (["DIR"], {}, "DIR holds files that are not wheels; expected a new or earlier bundle directory."),
    ],
)
def test_device_bundle_checks_its_arguments_before_downloading(tmp_path, args, env, message):
    d = tmp_path / "DIR"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    r = subprocess.run(
        [str(ROOT / "benchmarks" / "device_bundle.sh"), *args],
        cwd=tmp_path,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert r.returncode == 2 and r.stderr == f"device_bundle.sh: {message}\n", r.stderr
    assert r.stdout == "" and [p.name for p in d.iterdir()] == ["notes.txt"]
