"""The exact argv each container runtime is started with (only Charliecloud also runs here)."""

from __future__ import annotations

import os

import pytest

from inside_job import container
from inside_job.errors import SetupFailed
from inside_job.imageref import ImageError

MOUNTS = [("/jobs/7", "/klique/job"), ("/home/a/src", "/klique/work")]


def test_charliecloud_keeps_the_images_environment_under_the_tasks():
    argv = container.charliecloud_argv(
        "/img", ["python", "x.py"], {"B": "2", "A": "'$1'"}, MOUNTS, "/klique/work", True
    )
    assert argv == [
        "ch-run",
        "--unset-env=*",
        "--env-no-expand",
        f"--set-env=PATH='{container.DEFAULT_PATH}'",
        "--set-env=HOME='/tmp'",
        "--set-env=LANG='C.UTF-8'",
        "--set-env",  # the image's /ch/environment, over Klique's defaults
        "--set-env=A=''$1''",  # ch-run strips one pair of quotes: the value arrives as it is
        "--set-env=B='2'",
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
    without = container.charliecloud_argv("/img", ["true"], {}, [], "/", False)
    assert "--set-env" not in without  # ch-run refuses a bare --set-env without the file


def test_apptainer_exec_with_nv_cleanenv_no_eval_no_home_and_binds():
    argv = container.apptainer_argv(
        "apptainer", "/c/i.sif", ["nvidia-smi"], MOUNTS[:1], "/klique/job", "--nv", True
    )
    assert argv == [
        "apptainer",
        "exec",
        "--cleanenv",
        "--no-eval",
        "--no-home",  # the account's ~/.local stays out of the task's Python
        "--nv",
        "--bind",
        "/jobs/7:/klique/job",
        "--pwd",
        "/klique/job",
        "/c/i.sif",
        "nvidia-smi",
    ]
    old = container.apptainer_argv("singularity", "/i.sif", ["true"], [], "/", None, False)
    assert "--nv" not in old and "--no-eval" not in old and old[0] == "singularity"
    home = container.apptainer_argv("apptainer", "/i.sif", ["true"], [], "/", None, False, True)
    assert "--no-home" not in home  # the pool's `container_home: account`


@pytest.mark.parametrize(
    ("requested", "vendor", "gpu_env", "flag"),
    [
        (True, "nvidia", {}, "--nv"),  # a site that sets no CUDA variable in its jobs
        (True, "rocm", {}, "--rocm"),
        (False, "nvidia", {"CUDA_VISIBLE_DEVICES": "0"}, "--nv"),  # a host pool's grant
        (False, "nvidia", {}, None),
        (False, "nvidia", {"CUDA_VISIBLE_DEVICES": ""}, None),
    ],
)
def test_apptainers_gpu_libraries_follow_the_compute_resources_request(
    requested, vendor, gpu_env, flag
):
    assert container.apptainer_gpu_flag(requested, vendor, gpu_env) == flag


@pytest.mark.parametrize(
    ("binary", "version", "no_eval"),
    [
        ("apptainer", "apptainer version 1.0.3", False),
        ("apptainer", "apptainer version 1.1.0", True),
        ("apptainer", "apptainer version 1.3.4", True),
        ("singularity", "singularity-ce version 3.9.9", False),
        ("singularity", "singularity-ce version 3.10.0", True),
        ("singularity", "singularity version 3.8.7", False),
        ("singularity", "apptainer version 1.2.5", True),  # Apptainer's singularity link
        ("apptainer", "garbled", False),
    ],
)
def test_no_eval_follows_the_version(binary, version, no_eval):
    assert container.apptainer_supports_no_eval(binary, version) is no_eval


def test_apptainer_variables_pass_through_cleanenv_by_prefix():
    value = 'a "$HOME" `id` \\ $(x)'
    assert container.apptainer_environment("/usr/bin/apptainer", {"A": value}, True) == {
        "APPTAINERENV_A": value
    }
    # Without --no-eval Apptainer evaluates `export A="..."`: escaped so it gives value back.
    escaped = container.apptainer_environment("singularity", {"A": value}, False)
    assert escaped == {"SINGULARITYENV_A": 'a "\\$HOME" \\`id\\` \\\\ \\$(x)'}


def test_apptainer_converts_an_image_to_sif():
    assert container.apptainer_build_argv("apptainer", "/c/x.sif", "docker://python:3.12") == [
        "apptainer",
        "build",
        "/c/x.sif",
        "docker://python:3.12",
    ]


def test_enroot_create_start_with_its_own_rc_and_remove():
    create, start, remove = container.enroot_argvs(
        "/c/x.sqsh",
        "klique-7",
        "/s/rc",
        ["python", "x.py"],
        MOUNTS[:1],
        {"NVIDIA_VISIBLE_DEVICES": "2,3"},
    )
    assert create == ["enroot", "create", "--name", "klique-7", "/c/x.sqsh"]
    assert start == [
        "enroot",
        "start",
        "--rc",
        "/s/rc",
        "--mount",
        "/jobs/7:/klique/job:none:x-create=dir,bind",
        "--env",
        "NVIDIA_VISIBLE_DEVICES=2,3",
        "klique-7",
        "python",
        "x.py",
    ]
    assert remove == ["enroot", "remove", "--force", "klique-7"]


def test_enroots_rc_skips_the_entrypoint_and_quotes_every_value():
    rc = container.enroot_rc({"A": "it's $(x)\nB=1"}, "/klique/job")
    assert "export A='it'\"'\"'s $(x)\nB=1'" in rc
    assert rc.rstrip().endswith('cd /klique/job || exit 125\nexec "$@"')
    assert "/etc/rc" not in rc.replace("# Klique", "")


def test_enroot_gets_the_grant_not_the_hosts_nvidia_settings():
    host = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility", "X": "1"}
    gpu = {"NVIDIA_VISIBLE_DEVICES": "2,3", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    env = container.enroot_launcher_env(host, dict(gpu, CUDA_VISIBLE_DEVICES="0,1"))
    assert {k: v for k, v in env.items() if k.startswith("NVIDIA_")} == gpu
    assert env["ENROOT_RESTRICT_DEV"] == "y" and env["ENROOT_LOGIN_SHELL"] == "n"
    assert env["X"] == "1" and "CUDA_VISIBLE_DEVICES" not in env


def test_names_a_shell_cannot_set_are_refused():
    container.check_names({"OK_1": "x"}, "enroot")
    with pytest.raises(SetupFailed, match="'A-B' cannot be passed into a enroot"):
        container.check_names({"A-B": "x"}, "enroot")


def test_pyxis_srun_for_the_batch_template():
    assert container.pyxis_srun_argv("nvcr.io#nvidia/pytorch:24.01-py3", "/jobs/7") == [
        "srun",
        "--ntasks=1",
        "--container-image=nvcr.io#nvidia/pytorch:24.01-py3",
        "--container-mounts=/jobs/7:/jobs/7",
        "--container-workdir=/jobs/7",
        "--no-container-entrypoint",
        "--export=ALL",
    ]
    with pytest.raises(ImageError):
        container.pyxis_srun_argv("img", "/jobs/a,b")


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
