"""What an environment is built from: the task's requirement list or its project's file."""

from __future__ import annotations

import hashlib
import os
import sys

from inside_job.errors import SetupFailed, telling_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from inside_job.spec import TaskSpec


class Source:
    """Requirement lines to install, or a file handed to the installer as it is."""

    def __init__(self, lines: list[str] | None, path: str | None, material: str) -> None:
        self.lines = lines
        self.path = path
        self.material = material  # what the cache key hashes

    def describe(self) -> str:
        if self.lines is not None:
            return f"{len(self.lines)} package{'' if len(self.lines) == 1 else 's'}"
        return os.path.basename(self.path or "")


def from_spec(spec: TaskSpec, cwd: str, uv: str | None) -> Source:
    if spec.requirements is not None:
        return from_lines(spec.requirements)
    assert spec.requirements_file is not None
    path = os.path.join(cwd, spec.requirements_file)
    if not os.path.isfile(path):
        raise SetupFailed(f"requirements_file not found: {spec.requirements_file} (in {cwd})")
    name = os.path.basename(path)
    if name == "uv.lock":
        return from_lock(path, uv)
    if name == "pyproject.toml":
        return from_pyproject(path, uv)
    return from_requirements_file(path)


def from_lines(lines: list[str]) -> Source:
    """Requirement lines, stripped of comments and blanks; their order does not change the key."""
    kept = sorted({line.split(" #")[0].strip() for line in lines} - {""})
    kept = [line for line in kept if not line.startswith("#")]
    return Source(kept, None, "\n".join(kept))


def from_requirements_file(path: str) -> Source:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.splitlines()
    if any(line.strip().startswith("-") for line in lines):
        # Options (-r, -c, --index-url, -e): the installer reads the file itself.
        return Source(None, path, "file:" + _sha(text))
    return from_lines(lines)


def from_pyproject(path: str, uv: str | None) -> Source:
    with open(path, "rb") as f:
        data = f.read()
    if sys.version_info >= (3, 11):
        import tomllib

        project = tomllib.loads(data.decode("utf-8")).get("project", {})
        return from_lines(list(project.get("dependencies", [])))
    if uv is None:
        raise SetupFailed("reading pyproject.toml needs uv or Python 3.11+ on the node")
    return Source(None, path, "pyproject:" + _sha(data.decode("utf-8", "replace")))


def from_lock(path: str, uv: str | None) -> Source:
    """uv.lock, exported by uv to pinned requirement lines."""
    if uv is None:
        raise SetupFailed("installing from uv.lock needs uv (none on PATH or staged)")
    import subprocess

    result = subprocess.run(
        [
            uv,
            "export",
            "--frozen",
            "--no-hashes",
            "--no-header",
            "--no-emit-project",
            "--format",
            "requirements-txt",
            "--directory",
            os.path.dirname(path),
        ],
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        raise SetupFailed(f"uv export of {path} failed: {telling_line(result.stderr)}")
    lines = [line for line in result.stdout.splitlines() if not line.lstrip().startswith("#")]
    return from_lines(lines)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
