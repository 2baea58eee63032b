"""The task as the broker wrote it in task.json, read and checked (see docs/job-directory.md)."""

from __future__ import annotations

import json
import os

from inside_job.errors import SpecError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from inside_job.ranks import Place

TASK_FILE = "task.json"
SCHEDULERS = ("host", "slurm", "pbs", "lsf", "kubernetes")


class CodeSpec:
    """Where the task's code comes from: a folder, or a repository at a commit plus a diff."""

    def __init__(self, raw: dict) -> None:
        self.repo: str | None = _opt_str(raw, "repo", "code.")
        self.commit: str | None = _opt_str(raw, "commit", "code.")
        self.diff: str = _opt_str(raw, "diff", "code.") or ""
        self.workdir: str | None = _opt_str(raw, "workdir", "code.")
        self.subdir: str = _opt_str(raw, "subdir", "code.") or ""
        if self.workdir is None and not (self.repo and self.commit):
            raise SpecError("code: give either workdir, or repo and commit")


class ReportSpec:
    """Where to send HTTP reports."""

    def __init__(self, raw: dict) -> None:
        url = _opt_str(raw, "url", "report.")
        if not url or not url.startswith(("http://", "https://")):
            raise SpecError("report.url: must be an http:// or https:// address")
        self.url: str = url.rstrip("/")
        self.token: str = _opt_str(raw, "token", "report.") or ""


class AppSpec:
    """An application task's app: its route's tunnel, the secret's places, its walltime."""

    def __init__(self, raw: dict) -> None:
        self.name: str = _opt_str(raw, "name", "app.") or ""
        self.env: dict[str, str] = _env(raw.get("env"))
        self.upstream_headers: dict[str, str] = _env(raw.get("upstream_headers"))
        self.ready_path: str = _opt_str(raw, "ready_path", "app.") or "/"
        if not self.ready_path.startswith("/"):
            raise SpecError("app.ready_path: must start with /")
        self.walltime_s: int | None = _opt_int(raw, "walltime_s")
        # The registry's versions the launch resolved, staged before the app starts.
        models = raw.get("models") or []
        if not isinstance(models, list):
            raise SpecError("app.models: must be a list")
        self.models: list = models


class TaskSpec:
    """Every field of task.json version 1 that the runner uses."""

    def __init__(self, raw: dict, job_dir: str) -> None:
        self.job_dir = job_dir
        self.id = _task_id(raw.get("id"))
        self.name: str = str(raw.get("name") or "")
        self.scheduler: str = _opt_str(raw, "scheduler") or "host"
        self.command: list[str] = _command(raw.get("command"))
        self.env: dict[str, str] = _env(raw.get("env"))
        code = raw.get("code")
        self.code: CodeSpec | None = CodeSpec(_dict(code, "code")) if code is not None else None
        self.requirements: list[str] | None = _opt_str_list(raw, "requirements")
        self.requirements_file: str | None = _opt_str(raw, "requirements_file")
        self.image: str | None = _opt_str(raw, "image")
        self.runtime: str | None = _opt_str(raw, "runtime")
        self.container_scratch: str | None = _opt_str(raw, "container_scratch")
        # Apptainer: the account's home mounted ("account") or not (--no-home, the default);
        # the driver libraries for a task whose compute resource asks for GPUs.
        self.container_home: str = _opt_str(raw, "container_home") or "none"
        self.container_gpus: str = _opt_str(raw, "container_gpus") or "nvidia"
        self.gpus_requested: bool = raw.get("gpus_requested") is True
        self.gpus: list[str] | None = _gpus(raw.get("gpus"))
        report = raw.get("report")
        self.report: ReportSpec | None = (
            ReportSpec(_dict(report, "report")) if report is not None else None
        )
        app = raw.get("app")
        self.app: AppSpec | None = AppSpec(_dict(app, "app")) if app is not None else None
        self.cache_setting: str | None = _opt_str(raw, "cache_dir")  # the pool's cache_dir
        self._cache: str | None = None
        self.uv: str | None = _opt_str(raw, "uv")
        self.package_cache: str | None = _opt_str(raw, "package_cache")
        self.env_cache_bytes: int | None = _opt_int(raw, "env_cache_bytes")
        # A share of a GPU on a Kubernetes pool: the task's cap on GPU memory (MPS), in MiB.
        self.gpu_memory_limit_mb: int | None = _opt_int(raw, "gpu_memory_limit_mb")
        self.compile: str = _opt_str(raw, "compile") or "background"
        if self.compile not in ("background", "build"):
            raise SpecError('compile: must be "background" or "build"')
        self.nodes: int = _opt_int(raw, "nodes") or 1  # the task's nodes: one runner on each
        if self.nodes < 1:
            raise SpecError("nodes: must be 1 or more")
        self.place: Place | None = None  # this runner's place among them (inside_job/ranks.py)

    def cache(self) -> str:
        """This account's private cache folder, made on first use (never before it is needed:
        inside a read-only image there may be nowhere to make it)."""
        if self._cache is None:
            # on its path only: every job starts the runner
            from inside_job.private import cache_root

            self._cache = cache_root(self.cache_setting)
        return self._cache


def load(job_dir: str) -> TaskSpec:
    """Read <job_dir>/task.json; SpecError says what is wrong and where."""
    path = os.path.join(job_dir, TASK_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise SpecError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: expected a JSON object")
    if raw.get("version", 1) != 1:
        raise SpecError(f"{path}: version {raw.get('version')!r} is not supported (expected 1)")
    return TaskSpec(raw, job_dir)


def _task_id(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
        raise SpecError("id: must be an integer or a non-empty string")
    return str(value)


def _command(value: object) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        raise SpecError("command: must be a non-empty list of strings (an argv, not a shell line)")
    return list(value)


def _env(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError("env: must be an object of strings")
    for key, val in value.items():
        if not key or "=" in key or "\0" in key or not isinstance(val, str) or "\0" in val:
            raise SpecError(f"env: {key!r} must be a name without '=' mapped to a string")
    return dict(value)


def _gpus(value: object) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(g, (int, str)) and not isinstance(g, bool) for g in value
    ):
        raise SpecError("gpus: must be null or a list of device ids")
    return [str(g) for g in value]


def _dict(value: object, field: str) -> dict:
    if not isinstance(value, dict):
        raise SpecError(f"{field}: must be an object or null")
    return value


def _opt_str(raw: dict, key: str, prefix: str = "") -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise SpecError(f"{prefix}{key}: must be a string or null")
    return value


def _opt_int(raw: dict, key: str) -> int | None:
    value = raw.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise SpecError(f"{key}: must be an integer or null")
    return value


def _opt_str_list(raw: dict, key: str) -> list[str] | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{key}: must be a list of strings or null")
    return list(value)
