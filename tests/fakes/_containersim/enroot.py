"""`enroot` 3.x and 4.x: version, import, create, start, remove, list.

Follows enroot's doc/cmd/{import,create,start,remove,list}.md, doc/configuration.md,
doc/image-format.md, doc/standard-hooks.md and its source: src/docker.sh (reference syntax by
version, `docker::configure` for /etc/rc and /etc/environment), src/runtime.sh
(`runtime::_do_environ`, `runtime::start` checks), src/common.sh (`envsubst`, `envfmt`),
bin/enroot-switchroot.c (clearenv, the environment file, login shell, the rc script run by the
shell), conf/hooks/10-devices.sh (ENROOT_RESTRICT_DEV) and conf/hooks/98-nvidia.sh (NVIDIA_*
from the host's environment before the container's). The version is `KLIQUE_SIM_ENROOT_VERSION`
(default 3.5.0).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import sys
import tempfile

from _containersim import chrun, images
from _containersim.images import SimError

_USER = r"[A-Za-z0-9_.!~*'()%;:&=+$,-]+"
_IMAGE = r"[a-z0-9/._-]+"
_TAG = r"[A-Za-z0-9._:-]+"
_DIGEST = r"sha256:[A-Za-z0-9]+"
_FALSE = re.compile(r"^(no?|N[oO]?|[fF](alse)?|FALSE)$")


def version() -> str:
    return os.environ.get("KLIQUE_SIM_ENROOT_VERSION", "3.5.0")


def _major() -> int:
    return int(version().split(".")[0])


def setting(name: str, default: str) -> str | None:
    """A configuration value from the environment (enroot.in config::export, config::fini:
    a value such as n, no, false unsets it)."""
    value = os.environ.get(name) or default
    return None if _FALSE.match(value) else value


def _home() -> str:
    return os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir


def data_path() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(_home(), ".local", "share")
    return setting("ENROOT_DATA_PATH", os.path.join(base, "enroot")) or ""


def cache_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(_home(), ".cache")
    return setting("ENROOT_CACHE_PATH", os.path.join(base, "enroot")) or ""


def main(args: list[str]) -> int:
    try:
        if args == ["version"]:
            print(version())
            return 0
        commands = {
            "import": import_,
            "create": create,
            "start": start,
            "remove": remove,
            "list": list_,
        }
        if not args or args[0] not in commands:
            raise SimError(f"[ERROR] Unknown command: {args[0] if args else ''}")
        return commands[args[0]](args[1:])
    except SimError as exc:
        sys.stderr.write(exc.message + "\n")
        return exc.status


def parse_uri(uri: str) -> tuple[str, str, str, str]:
    """(user, registry, image, tag-or-digest) as src/docker.sh of this version reads uri."""
    if _major() < 4:
        m = re.fullmatch(rf"docker://(({_USER})@)?(([^#]+)#)?({_IMAGE})(:({_TAG}))?", uri)
        if m is None:
            raise SimError(f"[ERROR] Invalid image reference: {uri}")
        return m.group(2) or "", m.group(4) or "", m.group(5), m.group(7) or ""
    user = rf"docker://(({_USER})@)?"
    forms = [  # docker::_parse_uri, in its order
        (rf"{user}([^/#]+)/({_IMAGE})(?::{_TAG})?@({_DIGEST})", "slash"),
        (rf"{user}([^/#]+)/({_IMAGE})(?::({_TAG}))?", "slash"),
        (rf"{user}([^/@#:]+)(?::{_TAG})?@({_DIGEST})", "hub"),
        (rf"{user}([^/@#:]+)(?::({_TAG}))?", "hub"),
        (rf"{user}([^#/@]+)#({_IMAGE})(?::{_TAG})?@({_DIGEST})", "hash"),
        (rf"{user}([^#/@]+)#({_IMAGE})(?::({_TAG}))?", "hash"),
    ]
    for pattern, kind in forms:
        m = re.fullmatch(pattern, uri)
        if m is None:
            continue
        if kind == "hub":
            return m.group(2) or "", "", f"library/{m.group(3)}", m.group(4) or ""
        first, rest = m.group(3), m.group(4)
        if kind == "slash" and not re.search(r"[.:]", first):
            return m.group(2) or "", "", f"{first}/{rest}", m.group(5) or ""
        return m.group(2) or "", first, rest, m.group(5) or ""
    raise SimError(f"[ERROR] Invalid image reference: {uri}")


def import_(args: list[str]) -> int:
    output = None
    while args and args[0].startswith("-"):
        if args[0] in ("-o", "--output"):
            output, args = args[1], args[2:]
        elif args[0].startswith("--output="):
            output, args = args[0].split("=", 1)[1], args[1:]
        else:
            raise SimError(f"[ERROR] Invalid argument: {args[0]}")
    if len(args) != 1:
        raise SimError("Usage: enroot import [options] [--] URI")
    uri = args[0]
    _, registry, image, ref = parse_uri(uri)
    digest = ref if ref.startswith("sha256:") else ""
    found = images.lookup(registry, image, "" if digest else ref, digest)
    if found is None:
        host = registry or images.DOCKER_HUB
        raise SimError(
            f"[ERROR] URL https://{host}/v2/{image}/manifests/{ref or 'latest'} returned error "
            "code: 404 Not Found"
        )
    os.makedirs(cache_path(), exist_ok=True)
    output = output or re.sub(r"[:/#]", "+", uri.split("://", 1)[1]) + ".sqsh"
    if os.path.exists(output):
        raise SimError(f"[ERROR] File already exists: {output}")
    rootfs = images.staged_copy(found)
    try:
        images.enroot_metadata(rootfs, images.load_config(found), uri)
        images.pack(rootfs, output)
    finally:
        shutil.rmtree(os.path.dirname(rootfs), ignore_errors=True)
    return 0


def create(args: list[str]) -> int:
    name, force = None, False
    while args and args[0].startswith("-"):
        if args[0] in ("-n", "--name"):
            name, args = args[1], args[2:]
        elif args[0] in ("-f", "--force"):
            force, args = True, args[1:]
        else:
            raise SimError(f"[ERROR] Invalid argument: {args[0]}")
    if len(args) != 1:
        raise SimError("Usage: enroot create [options] [--] IMAGE")
    image = args[0]
    name = name or os.path.basename(image).rsplit(".sqsh", 1)[0]
    if "/" in name:
        raise SimError(f"[ERROR] Invalid argument: {name}")
    rootfs = os.path.join(data_path(), name)
    if os.path.exists(rootfs):
        if not force:
            raise SimError(f"[ERROR] File already exists: {rootfs}")
        shutil.rmtree(rootfs)
    os.makedirs(data_path(), exist_ok=True)
    images.unpack(image, rootfs)
    return 0


def remove(args: list[str]) -> int:
    names = [a for a in args if a not in ("-f", "--force")]
    for name in names:
        rootfs = os.path.join(data_path(), name)
        if "/" in name or not os.path.isdir(rootfs):
            raise SimError(f"[ERROR] No such file or directory: {rootfs}")
        shutil.rmtree(rootfs)
    return 0


def list_(args: list[str]) -> int:
    if os.path.isdir(data_path()):
        for name in sorted(os.listdir(data_path())):
            print(name)
    return 0


def envsubst(text: str) -> str:
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: os.environ.get(m.group(1), ""), text)


def envfmt(lines: list[str]) -> list[str]:
    """common::envfmt: trims, drops comments, ill-formed and ENROOT_ lines, strips quotes."""
    kept = []
    for line in lines:
        line = line.lstrip(" \t")
        if not line or line.startswith("#") or not re.match(r"[A-Za-z_][A-Za-z0-9_]*=", line):
            continue
        if line.startswith("ENROOT_"):
            continue
        line = re.sub(r"^([A-Za-z_][A-Za-z0-9_]*)=[\"'](.*)[\"'][ \t]*$", r"\1=\2", line)
        kept.append(line)
    return kept


def _options(args: list[str]) -> tuple[dict, list[str]]:
    opts: dict = {"rc": None, "mounts": [], "env": []}
    while args and args[0].startswith("-"):
        flag = args[0]
        if flag == "--":
            args = args[1:]
            break
        if flag in ("--rc", "-m", "--mount", "-e", "--env", "-c", "--conf"):
            value, args = args[1], args[2:]
            key = {"--rc": "rc", "-m": "mounts", "--mount": "mounts", "-e": "env", "--env": "env"}
            if flag in ("-c", "--conf"):
                raise SimError("[ERROR] --conf is not supported by the simulator")
            if key[flag] == "rc":
                opts["rc"] = value
            else:
                opts[key[flag]].extend(value.split("\n"))
        elif flag in ("-r", "--root", "-w", "--rw", "--pid", "--net", "--ipc", "--uts"):
            args = args[1:]
        else:
            raise SimError(f"[ERROR] Invalid argument: {flag}")
    return opts, args


def start(args: list[str]) -> int:
    opts, args = _options(args)
    if not args:
        raise SimError("Usage: enroot start [options] [--] NAME|IMAGE [COMMAND] [ARG...]")
    target, command = args[0], args[1:]
    for env in opts["env"]:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*(=|$)", env):
            raise SimError(f"[ERROR] Invalid argument: {env}")
    for mount in opts["mounts"]:
        if not re.fullmatch(r"[^\s]+(:[^\s]+)*", mount):
            raise SimError(f"[ERROR] Invalid argument: {mount}")
    if opts["rc"] is not None and not os.path.isfile(opts["rc"]):
        raise SimError(f"[ERROR] No such file or directory: {opts['rc']}")
    tmp = None
    if os.path.isfile(target):
        tmp = tempfile.mkdtemp(prefix="enroot-start-")
        rootfs = os.path.join(tmp, "rootfs")
        images.unpack(target, rootfs)
    else:
        if "/" in target:
            raise SimError(f"[ERROR] Invalid argument: {target}")
        rootfs = os.path.join(data_path(), target)
        if not os.path.isdir(rootfs):
            raise SimError(f"[ERROR] No such file or directory: {rootfs}")
    try:
        return _run(rootfs, opts, command)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _environment(rootfs: str, env_args: list[str]) -> list[str]:
    lines: list[str] = []
    path = os.path.join(rootfs, "etc", "environment")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            lines += envsubst(f.read()).splitlines()
    for item in env_args:
        lines.append(item if "=" in item else f"{item}={os.environ.get(item, '')}")
    return envfmt(lines)


def _gpus(envfile: list[str]) -> list[str]:
    """The GPUs /dev shows: 98-nvidia.sh takes NVIDIA_* from the host's environment first;
    without ENROOT_RESTRICT_DEV the host's whole /dev is there (10-devices.sh)."""
    visible = os.environ.get("NVIDIA_VISIBLE_DEVICES")
    if visible is None:
        for line in reversed(envfile):
            if line.startswith("NVIDIA_VISIBLE_DEVICES="):
                visible = line.split("=", 1)[1]
                break
    if setting("ENROOT_RESTRICT_DEV", "no") is None:
        return chrun.host_gpus()
    return chrun.select_gpus(visible)


def _run(rootfs: str, opts: dict, command: list[str]) -> int:
    envfile = _environment(rootfs, opts["env"])
    env: dict[str, str] = {}
    for line in envfile:  # enroot-switchroot: clearenv(), then setenv each line
        name, _, value = line.partition("=")
        env[name] = value
    login = setting("ENROOT_LOGIN_SHELL", "true") is not None
    if login:  # sys_login(): set when not set already
        user = pwd.getpwuid(os.getuid())
        for name, value in (
            ("TERM", "dumb"),
            ("HOME", user.pw_dir),
            ("USER", user.pw_name),
            ("PATH", "/usr/bin:/bin"),
        ):
            env.setdefault(name, value)
    binds = []
    for mount in opts["mounts"]:
        fields = mount.split(":")
        binds.append((fields[0], fields[1] if len(fields) > 1 else fields[0]))
    rc_file = opts["rc"] or os.path.join(rootfs, "etc", "rc")
    inner_rc = "/.klique-sim/rc"
    if os.path.isfile(rc_file):
        os.makedirs(os.path.join(rootfs, ".klique-sim"), exist_ok=True)
        shutil.copyfile(rc_file, os.path.join(rootfs, inner_rc.lstrip("/")))
        argv = ["/bin/sh", *(["-l"] if login else []), inner_rc, *command]
    elif command:
        argv = ["/bin/sh", "-c", 'exec "$@"', "sh", *command]
    else:
        argv = ["/bin/sh"]
    return chrun.run(rootfs, argv, env, binds, "/", _gpus(envfile))
