"""A runner's setup error keeps the line where the tool says what went wrong (git's "fatal:",
uv's "error:" or "×", pip's "ERROR:", the container tools' "Error:"/"FATAL:"), not the advice
the tool ends with; the outputs below were captured from the tools themselves."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from inside_job import code
from inside_job.errors import SetupFailed, telling_line

GIT_DUBIOUS = """\
fatal: detected dubious ownership in repository at '/srv/code/.git'
To add an exception for this directory, call:

\tgit config --global --add safe.directory /srv/code/.git
fatal: Could not read from remote repository.

Please make sure you have the correct access rights
and the repository exists.
"""

GIT_NOT_FOUND = """\
Cloning into bare repository '/tmp/x'...
ERROR: Repository not found.
fatal: Could not read from remote repository.

Please make sure you have the correct access rights
and the repository exists.
"""

UV_NO_SOLUTION = """\
  × No solution found when resolving dependencies:
  ╰─▶ Because nonexistent-pkg was not found in the package registry and you require
      nonexistent-pkg, we can conclude that your requirements are unsatisfiable.
"""

UV_ERROR = """\
error: Failed to fetch: `https://pypi.org/simple/numpy/`
  Caused by: Could not connect, are you offline?
"""

PIP_ERROR = """\
Collecting nonexistent-pkg
ERROR: Could not find a version that satisfies the requirement nonexistent-pkg (from versions: none)
ERROR: No matching distribution found for nonexistent-pkg
"""

PODMAN_ERROR = (
    "Trying to pull docker.io/library/nosuchimage:latest...\n"
    "Error: initializing source docker://nosuchimage:latest: reading manifest latest: "
    "requested access to the resource is denied\n"
)

APPTAINER_FATAL = (
    "INFO:    Converting SIF file to temporary sandbox...\n"
    "FATAL:   could not open image /srv/images/missing.sif: failed to retrieve path for "
    "/srv/images/missing.sif: lstat /srv/images/missing.sif: no such file or directory\n"
)

CH_RUN = "ch-run[4242]: error: can't find image: /var/tmp/img (ch_core.c:212 2 ENOENT)\n"


@pytest.mark.parametrize(
    ("output", "line"),
    [
        (GIT_DUBIOUS, "fatal: detected dubious ownership in repository at '/srv/code/.git'"),
        (GIT_NOT_FOUND, "ERROR: Repository not found."),
        (
            UV_NO_SOLUTION,
            "No solution found when resolving dependencies: Because nonexistent-pkg was not "
            "found in the package registry and you require",
        ),
        (UV_ERROR, "error: Failed to fetch: `https://pypi.org/simple/numpy/`"),
        (PIP_ERROR, PIP_ERROR.splitlines()[1]),
        (PODMAN_ERROR, PODMAN_ERROR.splitlines()[1]),
        (APPTAINER_FATAL, APPTAINER_FATAL.splitlines()[1]),
        (CH_RUN, CH_RUN.strip()),
        ("something odd\nthe last words\n", "the last words"),
        ("", "no message"),
    ],
)
def test_the_telling_line_is_the_one_that_says_what_went_wrong(output: str, line: str) -> None:
    assert telling_line(output) == line


@pytest.mark.skipif(os.geteuid() != 0, reason="a repository owned by another account needs root")
def test_a_clone_of_a_repository_owned_by_another_account_names_the_ownership(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"
    subprocess.run(["git", "init", "--quiet", str(source)], check=True)
    subprocess.run(["chown", "-R", "nobody", str(source)], check=True)
    with pytest.raises(SetupFailed) as raised:
        code._git(
            ["clone", "--quiet", "--bare", "--", str(source), str(tmp_path / "copy")],
            None,
            "cloning",
        )
    assert "fatal: detected dubious ownership" in raised.value.reason, raised.value.reason
    assert "repository exists" not in raised.value.reason
