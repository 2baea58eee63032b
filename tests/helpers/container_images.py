"""Images for the container tests: root file systems built from Debian's static busybox
(scripts/charliecloud-image), as Charliecloud directories and as images in the simulators'
registry (tests/fakes/_containersim/images.py describes its layout)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAKES = ROOT / "tests" / "fakes"
REGISTRY_HOST = "registry.example.org"
CONDA_ENV = [
    "PATH=/opt/conda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LD_LIBRARY_PATH=/opt/conda/lib",
    "CONDA_PREFIX=/opt/conda",
]
# A Debian-like /etc/profile: a login shell resets PATH and loses the image's own.
PROFILE = 'PATH="/usr/local/bin:/usr/bin:/bin"\nexport PATH\n'
_STDLIB_SKIP = {
    "test",
    "idlelib",
    "tkinter",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
    "dist-packages",
    "site-packages",
    "__pycache__",
}


def busybox_rootfs(dest: Path) -> Path:
    subprocess.run(
        [str(ROOT / "scripts" / "charliecloud-image"), str(dest)], check=True, capture_output=True
    )
    shutil.copy(FAKES / "gpu-probe", dest / "bin" / "gpu-probe")
    return dest


def add_conda(rootfs: Path) -> None:
    (rootfs / "opt" / "conda" / "bin").mkdir(parents=True)
    (rootfs / "opt" / "conda" / "lib").mkdir()
    tool = rootfs / "opt" / "conda" / "bin" / "conda-tool"
    tool.write_text('#!/bin/sh\necho "conda-tool PATH=$PATH LD=$LD_LIBRARY_PATH MINE=$MINE"\n')
    tool.chmod(0o755)
    (rootfs / "etc" / "profile").write_text(PROFILE)


def add_python(rootfs: Path) -> None:
    """The host's python3 with its libraries and standard library (for Pyxis, which starts the
    runner inside the image)."""
    python = os.path.realpath("/usr/bin/python3")
    version = os.path.basename(python)
    for path in [python, *_libraries(python)]:
        target = rootfs / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    (rootfs / "usr" / "bin" / "python3").unlink(missing_ok=True)
    os.symlink(version, rootfs / "usr" / "bin" / "python3")
    stdlib = f"/usr/lib/{version}"
    shutil.copytree(
        stdlib,
        rootfs / stdlib.lstrip("/"),
        symlinks=True,
        ignore=lambda d, names: [n for n in names if n in _STDLIB_SKIP or n.startswith("config-")],
    )


def _libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if path.startswith("/"):
            found.append(path)
            found += [p for p in glob.glob(os.path.dirname(path) + "/ld-linux*")]
    return sorted(set(found))


def charliecloud_image(rootfs: Path, env: list[str]) -> Path:
    """A Charliecloud directory image: /ch/environment holds the image's ENV, as ch-image writes."""
    (rootfs / "ch").mkdir(exist_ok=True)
    (rootfs / "ch" / "environment").write_text("".join(f"{line}\n" for line in env))
    return rootfs


def publish(registry: Path, repository: str, tag: str, rootfs: Path, **config: object) -> str:
    """Put rootfs in the simulators' registry as REGISTRY_HOST/repository:tag; its reference."""
    folder = registry / REGISTRY_HOST / repository / tag
    folder.mkdir(parents=True)
    shutil.copytree(rootfs, folder / "rootfs", symlinks=True)
    (folder / "config.json").write_text(json.dumps({"config": config}))
    return f"{REGISTRY_HOST}/{repository}:{tag}"


PODMAN_IMAGE = "localhost/klique-python:test"
SETUID_PYTHON = "/usr/local/bin/setuid-python"
# The host's git and the helpers `git clone` runs (they are git itself under other names).
_GIT_HELPERS = ("git-upload-pack", "git-receive-pack", "git-remote-http", "git-remote-https")


def podman_image(podman: str = "podman", name: str = PODMAN_IMAGE) -> str:
    """An image in podman's local store holding busybox, the host's python3 (with the libraries
    of its extension modules), git, and a setuid-root copy of python3 (SETUID_PYTHON): imported
    from a root file system, as no registry is reachable. Built once; later calls find it and
    return at once."""
    if subprocess.run([podman, "image", "exists", name], capture_output=True).returncode == 0:
        return name
    with tempfile.TemporaryDirectory() as work:
        rootfs = busybox_rootfs(Path(work) / "rootfs")
        add_python(rootfs)
        python = os.path.realpath("/usr/bin/python3")
        modules = glob.glob(f"/usr/lib/{os.path.basename(python)}/lib-dynload/*.so")
        git = shutil.which("git") or "/usr/bin/git"
        for path in {p for binary in [*modules, git] for p in _libraries(binary)}:
            _copy_in(rootfs, path)
        _copy_in(rootfs, git)
        helpers = rootfs / "usr" / "lib" / "git-core"
        helpers.mkdir(parents=True, exist_ok=True)
        for helper in _GIT_HELPERS:
            (helpers / helper).symlink_to("/usr/bin/git")
        # A setuid-root interpreter: what no-new-privileges must keep from elevating a task.
        suid = rootfs / SETUID_PYTHON.lstrip("/")
        suid.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(python, suid)
        os.chown(suid, 0, 0)
        suid.chmod(0o4755)
        tar = Path(work) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
        subprocess.run(
            [podman, "import", "--quiet", str(tar), name], check=True, capture_output=True
        )
    return name


def _copy_in(rootfs: Path, path: str) -> None:
    target = rootfs / path.lstrip("/")
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
