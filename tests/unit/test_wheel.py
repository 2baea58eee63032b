"""The wheel carries what an installed Klique reads from its own package: the batch templates
(the checkout's top-level templates/, shipped as `klique_templates`), the store's migrations,
the deployment manifests, the app catalogue and the web UI's files."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Left out of the copy the wheel is built from: nothing of these is packaged, and a build/ or
# *.egg-info/ here would be a stale leftover the build must not read.
_NOT_COPIED = {".git", ".venv", "build", "dist", "tests", "docs", "bench"}
_NEVER_COPIED = shutil.ignore_patterns("__pycache__", "*.egg-info", ".*_cache")

SHIPPED = (
    "klique_templates/README.md",
    "klique_templates/slurm/default.sh.j2",
    "klique_templates/pbs/default.sh.j2",
    "klique_templates/lsf/default.sh.j2",
    "klique_templates/kubernetes/pod.yaml",
    "klique_templates/partials/run.sh.j2",
    "broker/store/migrations/env.py",
    "broker/store/migrations/versions/0001_initial.py",
    "broker/deploy/kubernetes-rbac.yaml",
    "broker/app_catalogue/jupyter.yaml",
    "broker/web/templates/base.html",
    "klique_deploy/Containerfile",  # `klique deploy files DEST` copies these out
    "klique_deploy/systemd/klique-server.service",
    "klique_deploy/nginx/klique.conf",
)


def _ignore(folder: str, names: list[str]) -> set[str]:
    left_out = set(_NEVER_COPIED(folder, names))
    return left_out | (_NOT_COPIED & set(names)) if Path(folder) == ROOT else left_out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel, built as an index builds it (sdist first, the wheel from the sdist), from a
    copy of the checkout: the build writes egg-info and build/ beside its sources."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv, "uv is a test dependency"
    source = tmp_path_factory.mktemp("checkout") / "klique"
    shutil.copytree(ROOT, source, ignore=_ignore)
    dist = source.parent / "dist"
    built = subprocess.run(
        [uv, "build", "--out-dir", str(dist), str(source)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return zipfile.ZipFile(next(dist.glob("klique-*.whl")))


def test_the_wheel_carries_the_templates_and_the_package_data(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    missing = [name for name in SHIPPED if name not in names]
    assert not missing, missing


def test_the_templates_ship_under_their_package_only(wheel: zipfile.ZipFile) -> None:
    # one copy, where broker.templates looks for it: neither a top-level `templates` package
    # (a name any project may take) nor the old place inside broker/
    names = wheel.namelist()
    assert not [name for name in names if name.startswith(("templates/", "broker/batch_"))]
    shipped = {name for name in names if name.startswith("klique_templates/")}
    in_checkout = {
        "klique_templates/" + str(path.relative_to(ROOT / "templates"))
        for path in (ROOT / "templates").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert shipped == in_checkout
