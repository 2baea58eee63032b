"""Task environments: one virtual environment per key (requirements, interpreter, platform, image),
built once under a lock into a temporary folder, renamed into place with a ready marker, reused."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

from inside_job import envsource
from inside_job.locks import FileLock

try:  # the built-in BLAKE2 spares loading OpenSSL (2-3 ms) on every start
    from _blake2 import blake2b
except ImportError:  # pragma: no cover
    from hashlib import blake2b

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

    from inside_job.jobfiles import Console
    from inside_job.spec import TaskSpec

MARKER = "klique-env.json"
DEFAULT_BUDGET_BYTES = 20 * 1024**3


class Handle:
    """A ready environment and the shared lock that marks it in use."""

    def __init__(self, key: str, path: str, lock: FileLock, info: dict, built: bool) -> None:
        self.key = key
        self.path = path
        self.lock = lock
        self.info = info
        self.built = built

    def report(self) -> dict:
        """The 'environment' object of exit.json."""
        return {
            "key": self.key,
            "reused": not self.built,
            "tool": self.info.get("tool"),
            "built": self.info.get("built"),
            "build_s": self.info.get("seconds") if self.built else None,
        }


def provide(spec: TaskSpec, cwd: str, console: Console) -> Handle:
    """The task's environment, built if no ready one has its key; held in use until closed."""
    uv = find_uv(spec.uv, console)
    source = envsource.from_spec(spec, cwd, uv)
    key = env_key(source.material, interpreter(), platform_tag(), spec.image)
    envs = os.path.join(spec.cache(), "envs")
    os.makedirs(envs, exist_ok=True)
    handle = acquire(envs, key, lambda path: build(path, source, uv, spec, console), console)
    if handle.built:
        from inside_job import envcache  # on its path only: every job starts the runner

        budget = spec.env_cache_bytes or DEFAULT_BUDGET_BYTES
        for gone in envcache.evict(envs, budget, keep=key):
            console.say(f"evicted environment {gone[:12]} (cache over {budget} bytes)")
    return handle


def acquire(
    envs: str, key: str, builder: Callable[[str], dict], console: Console | None = None
) -> Handle:
    """Reuse the ready environment of key, or build it with builder(path) -> info, once."""
    path = os.path.join(envs, key)
    lock = FileLock(path + ".lock")
    lock.shared()  # held while the task runs: eviction skips the environment
    info = read_marker(path)
    built = False
    if info is None:
        with FileLock(path + ".build.lock"):
            info = read_marker(path)
            if info is None:
                info = builder(path)
                built = True
    if not built:
        touch(path)
        if console is not None:
            console.say(f"reusing environment {key[:12]} (built {_when(info.get('built'))})")
    return Handle(key, path, lock, info, built)


def build(
    path: str, source: envsource.Source, uv: str | None, spec: TaskSpec, console: Console
) -> dict:
    """Build into a temporary folder, write the marker, rename into place; caller holds the lock."""
    from inside_job import envcache, installer  # on its path only: every job starts the runner

    key = os.path.basename(path)
    console.say(
        f"building environment {key[:12]} with {'uv' if uv else 'pip'} ({source.describe()})"
    )
    envcache.remove_partial(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    started = time.time()
    try:
        _install(tmp, path, source, uv, spec)
    except BaseException:
        envcache.remove_partial(path)
        raise
    info = _describe(tmp, source, uv, spec, round(time.time() - started, 3))
    _write_marker(tmp, info)
    os.rename(tmp, path)
    console.say(f"built environment {key[:12]} in {info['seconds']:.1f} s")
    if uv and spec.compile != "build":
        installer.compile_in_background(path, path + ".lock")
    return info


def _install(
    tmp: str, final: str, source: envsource.Source, uv: str | None, spec: TaskSpec
) -> None:
    from inside_job import installer  # on its path only: every job starts the runner
    from inside_job.private import package_cache  # on its path only: every job starts the runner

    cache = package_cache(spec.package_cache)
    if uv:
        installer.with_uv(uv, sys.executable, tmp, source, cache, spec.compile == "build")
    else:
        installer.with_pip(sys.executable, tmp, final, source, cache)


def _describe(
    tmp: str, source: envsource.Source, uv: str | None, spec: TaskSpec, seconds: float
) -> dict:
    """The ready marker's content."""
    from inside_job import envcache  # on its path only: every job starts the runner

    return {
        "key": os.path.basename(tmp).split(".tmp-")[0],
        "tool": "uv" if uv else "pip",
        "built": time.time(),
        "seconds": seconds,
        "bytes": envcache.tree_bytes(tmp),
        "requirements": source.lines,
        "requirements_file": source.path,
        "python": interpreter(),
        "image": spec.image,
    }


def env_key(material: str, python: str, platform: str, image: str | None) -> str:
    blob = json.dumps([material, python, platform, image or ""])
    return blake2b(blob.encode("utf-8"), digest_size=16).hexdigest()


def interpreter() -> str:
    impl = sys.implementation
    version = ".".join(str(n) for n in sys.version_info[:3])
    return f"{impl.name}-{version}-{os.path.realpath(sys.executable)}"


def platform_tag() -> str:
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or "libc"
    except (ValueError, OSError):
        libc = "libc"
    return f"{sys.platform}-{os.uname().machine}-{libc}"


def find_uv(configured: str | None, console: Console) -> str | None:
    """The staged uv if configured and present, else uv on PATH, else None (venv + pip)."""
    import shutil

    if configured:
        if os.access(configured, os.X_OK):
            return configured
        console.say(f"staged uv {configured} is missing; looking on PATH")
    return shutil.which("uv")


def read_marker(path: str) -> dict | None:
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def touch(path: str) -> None:
    """Record a use: eviction goes by the marker's modification time."""
    with contextlib.suppress(OSError):
        os.utime(os.path.join(path, MARKER))


def _write_marker(path: str, info: dict) -> None:
    from inside_job.jobfiles import write_json  # on its path only: every job starts the runner

    write_json(os.path.join(path, MARKER), info)


def _when(stamp: object) -> str:
    if not isinstance(stamp, (int, float)):
        return "earlier"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
