"""The exact argv each container runtime is started with (only Charliecloud also runs here)."""

from __future__ import annotations

import os

import pytest

from inside_job import container
from inside_job.errors import SetupFailed

MOUNTS = [("/jobs/7", "/klique/job"), ("/home/a/src", "/klique/work")]


def test_charliecloud_starts_from_an_empty_environment():
    argv = container.charliecloud_argv(
        "/img", ["python", "x.py"], {"B": "2", "A": "$1"}, MOUNTS, "/klique/work"
    )
    assert argv == [
        "ch-run",
        "--unset-env=*",
        "--env-no-expand",
        "--set-env=A=$1",
        "--set-env=B=2",
        "-b",
        "/jobs/7:/klique/job",
        "-b",
        "/home/a/src:/klique/work",
        "-c",
        "/klique/work",
        "/img",
        "--",
        "python",
        "x.py",
    ]


def test_apptainer_exec_with_nv_cleanenv_and_binds():
    argv = container.apptainer_argv(
        "apptainer", "/c/i.sif", ["nvidia-smi"], MOUNTS[:1], "/klique/job", gpus=True
    )
    assert argv == [
        "apptainer",
        "exec",
        "--cleanenv",
        "--nv",
        "--bind",
        "/jobs/7:/klique/job",
        "--pwd",
        "/klique/job",
        "/c/i.sif",
        "nvidia-smi",
    ]
    no_gpu = container.apptainer_argv("singularity", "/i.sif", ["true"], [], "/", gpus=False)
    assert "--nv" not in no_gpu and no_gpu[0] == "singularity"


def test_apptainer_variables_pass_through_cleanenv_by_prefix():
    assert container.apptainer_environment("/usr/bin/apptainer", {"A": "1, 2"}) == {
        "APPTAINERENV_A": "1, 2"
    }
    assert container.apptainer_environment("singularity", {"A": "x"}) == {"SINGULARITYENV_A": "x"}


def test_apptainer_converts_an_image_to_sif():
    assert container.apptainer_build_argv("apptainer", "/c/x.sif", "docker://python:3.12") == [
        "apptainer",
        "build",
        "/c/x.sif",
        "docker://python:3.12",
    ]


def test_enroot_create_start_and_remove():
    create, start, remove = container.enroot_argvs(
        "/c/x.sqsh", "klique-7", ["python", "x.py"], {"A": "1"}, MOUNTS[:1], "/klique/job"
    )
    assert create == ["enroot", "create", "--force", "--name", "klique-7", "/c/x.sqsh"]
    assert start == [
        "enroot",
        "start",
        "--mount",
        "/jobs/7:/klique/job",
        "--env",
        "A=1",
        "klique-7",
        "/bin/sh",
        "-c",
        'cd "$0" && exec "$@"',
        "/klique/job",
        "python",
        "x.py",
    ]
    assert remove == ["enroot", "remove", "--force", "klique-7"]
    assert container.enroot_import_argv("/c/x.sqsh", "docker://ubuntu") == [
        "enroot",
        "import",
        "--output",
        "/c/x.sqsh",
        "docker://ubuntu",
    ]


def test_pyxis_prefix_for_the_batch_template():
    assert container.pyxis_srun_prefix(
        "nvcr.io#nvidia/pytorch:24.01-py3", "/jobs/7", ("/scratch/cache",)
    ) == [
        "srun",
        "--ntasks=1",
        "--container-image=nvcr.io#nvidia/pytorch:24.01-py3",
        "--container-mounts=/jobs/7:/jobs/7,/scratch/cache:/scratch/cache",
        "--container-workdir=/jobs/7",
    ]
    with pytest.raises(ValueError):
        container.pyxis_srun_prefix("img", "/jobs/a,b")


def test_binds_map_the_code_folder_inside_or_outside_the_job():
    assert container.binds("/jobs/7", "/jobs/7") == ([("/jobs/7", "/klique/job")], "/klique/job")
    assert container.binds("/jobs/7", "/jobs/7/code/app") == (
        [("/jobs/7", "/klique/job")],
        "/klique/job/code/app",
    )
    assert container.binds("/jobs/7", "/src") == (
        [("/jobs/7", "/klique/job"), ("/src", "/klique/work")],
        "/klique/work",
    )


def test_converted_images_are_named_by_digest_when_pinned():
    pinned = container.cached_image_path("/c", "docker://x@sha256:" + "ab" * 32, ".sif")
    assert pinned == os.path.join("/c", "images", "ab" * 16 + ".sif")
    assert container.cached_image_path("/c", "docker://x:1", ".sif") != container.cached_image_path(
        "/c", "docker://x:2", ".sif"
    )


def test_runtime_choice_follows_the_image_and_what_is_installed(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    assert container.choose_runtime("anything", "enroot") == "enroot"
    with pytest.raises(SetupFailed, match="unknown"):
        container.choose_runtime("x", "docker")
    with pytest.raises(SetupFailed, match="no container runtime for docker://x"):
        container.choose_runtime("docker://x", None)
    for name in ("ch-run", "singularity"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    assert container.choose_runtime(str(tmp_path), None) == "charliecloud"
    assert container.choose_runtime("/images/x.sif", None) == "singularity"
    assert container.choose_runtime("docker://x", None) == "singularity"
