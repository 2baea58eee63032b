"""One task image, written the way each container runtime (and version) reads it."""

from __future__ import annotations

import pytest

from inside_job.imageref import ImageError, check, for_runtime, parse, parse_version

D = "sha256:" + "ab" * 32
CASES = [
    # reference, apptainer, enroot 3.x, enroot 4.x, pyxis
    (
        "python:3.12",
        "docker://python:3.12",
        "docker://python:3.12",
        "docker://python:3.12",
        "python:3.12",
    ),
    ("ubuntu", "docker://ubuntu", "docker://ubuntu", "docker://ubuntu", "ubuntu"),
    (
        "nvidia/cuda:12.4.1-base-ubuntu22.04",
        "docker://nvidia/cuda:12.4.1-base-ubuntu22.04",
        "docker://nvidia/cuda:12.4.1-base-ubuntu22.04",
        "docker://nvidia/cuda:12.4.1-base-ubuntu22.04",
        "nvidia/cuda:12.4.1-base-ubuntu22.04",
    ),
    (
        "nvcr.io/nvidia/pytorch:24.01-py3",
        "docker://nvcr.io/nvidia/pytorch:24.01-py3",
        "docker://nvcr.io#nvidia/pytorch:24.01-py3",
        "docker://nvcr.io#nvidia/pytorch:24.01-py3",
        "nvcr.io#nvidia/pytorch:24.01-py3",
    ),
    (
        "nvcr.io#nvidia/pytorch:24.01-py3",
        "docker://nvcr.io/nvidia/pytorch:24.01-py3",
        "docker://nvcr.io#nvidia/pytorch:24.01-py3",
        "docker://nvcr.io#nvidia/pytorch:24.01-py3",
        "nvcr.io#nvidia/pytorch:24.01-py3",
    ),
    (
        "docker://ghcr.io/org/team/app:v1.2",
        "docker://ghcr.io/org/team/app:v1.2",
        "docker://ghcr.io#org/team/app:v1.2",
        "docker://ghcr.io#org/team/app:v1.2",
        "ghcr.io#org/team/app:v1.2",
    ),
    (
        "localhost:5000/app",
        "docker://localhost:5000/app",
        "docker://localhost:5000#app",
        "docker://localhost:5000#app",
        "localhost:5000#app",
    ),
    (
        "registry:5000/a/b:1",
        "docker://registry:5000/a/b:1",
        "docker://registry:5000#a/b:1",
        "docker://registry:5000#a/b:1",
        "registry:5000#a/b:1",
    ),
    (f"python@{D}", f"docker://python@{D}", None, f"docker://python@{D}", f"python@{D}"),
    (
        f"ghcr.io/x/y:1@{D}",
        f"docker://ghcr.io/x/y:1@{D}",
        None,
        f"docker://ghcr.io#x/y:1@{D}",
        f"ghcr.io#x/y:1@{D}",
    ),
    (
        "alice@nvcr.io#nvidia/pytorch:24.01",
        None,
        "docker://alice@nvcr.io#nvidia/pytorch:24.01",
        "docker://alice@nvcr.io#nvidia/pytorch:24.01",
        "alice@nvcr.io#nvidia/pytorch:24.01",
    ),
]


@pytest.mark.parametrize(("image", "apptainer", "enroot3", "enroot4", "pyxis"), CASES)
def test_each_runtime_gets_its_own_syntax(image, apptainer, enroot3, enroot4, pyxis):
    for runtime, version, wanted in [
        ("apptainer", None, apptainer),
        ("singularity", None, apptainer),
        ("enroot", (3, 5, 0), enroot3),
        ("enroot", (4, 1, 2), enroot4),
        ("pyxis", None, pyxis),
    ]:
        if wanted is None:
            with pytest.raises(ImageError):
                for_runtime(image, runtime, version)
        else:
            assert for_runtime(image, runtime, version) == wanted, (runtime, version)


def test_a_digest_for_enroot_3_says_why_and_what_to_do():
    with pytest.raises(
        ImageError, match="enroot 3.5 cannot import.*use a tag, or install enroot 4"
    ):
        for_runtime(f"python@{D}", "enroot", (3, 5))


def test_docker_hubs_rule_for_the_first_part():
    assert parse("myorg/app:1").registry == ""  # no "." or ":": a Docker Hub namespace
    assert parse("my.org/app:1").registry == "my.org"


@pytest.mark.parametrize(
    "bad",
    [
        "Python:3",
        "a b",
        "$(id)",
        "x;y",
        "img:`id`",
        "img\n",
        "-rf",
        "img:tag:tag",
        "a//b",
        "img@sha256:short",
        "/images/a b.sif",
        "/images/$(id).sif",
        "/images/../../etc",
        "",
        "img#",
        "#img",
    ],
)
def test_anything_else_is_refused_before_it_reaches_a_script(bad):
    with pytest.raises(ImageError):
        check(bad)


def test_local_images_go_to_the_runtimes_that_read_them():
    assert for_runtime("/images/a.sif", "apptainer") == "/images/a.sif"
    assert for_runtime("/images/a.sqsh", "enroot") == "/images/a.sqsh"
    assert for_runtime("/images/a.sqfs", "charliecloud") == "/images/a.sqfs"
    assert for_runtime("/images/dir", "charliecloud") == "/images/dir"
    with pytest.raises(ImageError, match="enroot runs a .sqsh file"):
        for_runtime("/images/a.sif", "enroot")
    with pytest.raises(ImageError, match="ch-image pull"):
        for_runtime("python:3.12", "charliecloud")


def test_versions_are_read_from_each_runtimes_words():
    assert parse_version("apptainer version 1.2.5") == (1, 2, 5)
    assert parse_version("singularity-ce version 3.11.4-1.el8") == (3, 11, 4)
    assert parse_version("3.4.1\n") == (3, 4, 1)
    assert parse_version("unknown") is None
