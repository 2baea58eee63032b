"""The runner's caches (environments, git mirrors, images, downloads) are each account's own:
a folder of mode 700 that this account owns, under a parent no other account can swap it in.
Anything else already at that path (planted by another account) is refused, never used."""

from __future__ import annotations

import os
import pwd
import stat

from inside_job.errors import SetupFailed


def account() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def cache_root(configured: str | None) -> str:
    """The folder for this account's caches: under the pool's `cache_dir` (one folder per
    account), else ~/.cache/klique."""
    if configured:
        return private_dir(os.path.join(configured, account()))
    return private_dir(os.path.join(os.path.expanduser("~"), ".cache", "klique"))


def package_cache(configured: str | None) -> str:
    """The installers' download cache: node-local (shared read-write breaks) and private."""
    base = configured or os.environ.get("KLIQUE_PACKAGE_CACHE")
    if base:
        return os.path.join(private_dir(os.path.join(base, account())), "package-cache")
    return os.path.join(private_dir(f"/var/tmp/klique-{os.getuid()}"), "package-cache")


def private_dir(path: str) -> str:
    """`path` as a folder of this account's alone, made if missing; SetupFailed otherwise."""
    parent = os.path.dirname(path.rstrip("/")) or "/"
    os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SetupFailed(f"cannot make the cache folder {path}: {exc.strerror}") from exc
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        raise SetupFailed(
            f"the cache folder {path} is not this account's own folder (a link, a file, or owned "
            f"by uid {found.st_uid}): it is not used; fix: remove it, or set the pool's cache_dir"
        )
    if found.st_mode & 0o077:
        os.chmod(path, 0o700)
    above = os.stat(parent)
    shared = above.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if shared and not above.st_mode & stat.S_ISVTX and above.st_uid != os.getuid():
        raise SetupFailed(
            f"the cache folder's parent {parent} is writable by other accounts without the "
            f"sticky bit, so they could swap the cache; fix: chmod +t {parent}"
        )
    return path
