"""`apptainer` and `singularity` (SingularityCE): --version, build, exec.

Follows the Apptainer user guide ("Environment and Metadata", "Bind Paths and Mounts") and
Apptainer's source for the environment: internal/pkg/util/env/create.go (what --cleanenv keeps,
the APPTAINERENV_/SINGULARITYENV_ prefixes, PATH and HOME) and
internal/pkg/runtime/engine/apptainer/process_linux.go `injectEnvHandler` (each prefixed
variable becomes `export NAME="VALUE"`, only `"` escaped, and is shell-evaluated when sourced;
with --no-eval, Apptainer 1.1+ and SingularityCE 3.10+, `export NAME='VALUE'`).
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

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ALWAYS_PASS = {
    "TERM",
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "no_proxy",
    "NO_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "ftp_proxy",
    "FTP_PROXY",
}
ALWAYS_OMIT = {
    "HOME",
    "PATH",
    "LD_LIBRARY_PATH",
    "APPTAINER_SHELL",
    "APPTAINER_APPNAME",
    "SINGULARITY_SHELL",
    "SINGULARITY_APPNAME",
}
NOT_OVERRIDABLE = {
    "HOME",
    "PATH",
    "APPTAINER_SHELL",
    "APPTAINER_APPNAME",
    "SINGULARITY_SHELL",
    "SINGULARITY_APPNAME",
}
# Docker reference grammar, as containers/image parses docker:// sources.
_REFERENCE = re.compile(
    r"docker://(?:(?P<registry>(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)(?::\d+)?|"
    r"[A-Za-z0-9-]+:\d+)/)?(?P<repo>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?"
)


class Flavour:
    """apptainer, or singularity as SingularityCE."""

    def __init__(self, program: str) -> None:
        self.program = program
        if program == "singularity":
            self.version = os.environ.get("KLIQUE_SIM_SINGULARITY_VERSION", "3.11.4")
            self.banner = f"singularity-ce version {self.version}"
            self.prefixes = ["SINGULARITYENV_"]
            self.no_eval = _version(self.version) >= (3, 10)
            self.upper = "SINGULARITY"
        else:
            self.version = os.environ.get("KLIQUE_SIM_APPTAINER_VERSION", "1.3.4")
            self.banner = f"apptainer version {self.version}"
            self.prefixes = ["APPTAINERENV_", "SINGULARITYENV_"]
            self.no_eval = _version(self.version) >= (1, 1)
            self.upper = "APPTAINER"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def main(program: str, args: list[str]) -> int:
    flavour = Flavour(program)
    try:
        if args in (["--version"], ["version"]):
            print(flavour.banner)
            return 0
        if args and args[0] == "build":
            return build(flavour, args[1:])
        if args and args[0] == "exec":
            return execute(flavour, args[1:])
        raise SimError(f"Error: unknown command {args[0] if args else ''!r} for {program!r}", 255)
    except SimError as exc:
        sys.stderr.write(exc.message + "\n")
        return exc.status


def _cache_dir(flavour: Flavour) -> str:
    home = pwd.getpwuid(os.getuid()).pw_dir
    return os.environ.get(f"{flavour.upper}_CACHEDIR") or os.path.join(
        home, f".{flavour.program}", "cache"
    )


def _tmp_dir(flavour: Flavour) -> str:
    return os.environ.get(f"{flavour.upper}_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"


def build(flavour: Flavour, args: list[str]) -> int:
    if len(args) != 2:
        raise SimError(f"Error: requires exactly 2 arg(s), only received {len(args)}", 255)
    output, source = args
    match = _REFERENCE.fullmatch(source)
    if match is None:
        raise SimError(f"FATAL:   Unable to build from {source}: invalid reference format", 255)
    found = images.lookup(
        match.group("registry") or "",
        match.group("repo"),
        match.group("tag") or "",
        match.group("digest") or "",
    )
    if found is None:
        raise SimError(
            "FATAL:   While making image from oci registry: error fetching image to cache: "
            f"failed to get checksum for {source}: reading manifest in "
            f"{match.group('registry') or 'docker.io'}/{match.group('repo')}: "
            "requested access to the resource is denied",
            255,
        )
    os.makedirs(os.path.join(_cache_dir(flavour), "blob"), exist_ok=True)
    rootfs = images.staged_copy(found)
    try:
        images.apptainer_metadata(rootfs, images.load_config(found))
        images.pack(rootfs, output)
    finally:
        shutil.rmtree(os.path.dirname(rootfs), ignore_errors=True)
    print(f"INFO:    Build complete: {output}")
    return 0


def _parse_exec(flavour: Flavour, args: list[str]) -> tuple[dict, list[str]]:
    opts: dict = {
        "cleanenv": False,
        "no_eval": False,
        "nv": False,
        "no_home": False,
        "binds": [],
        "pwd": None,
    }
    while args and args[0].startswith("-"):
        flag, _, value = args[0].partition("=")
        takes = flag in ("--bind", "-B", "--pwd")
        if takes and not value:
            value, args = args[1], args[1:]
        args = args[1:]
        if flag in ("--cleanenv", "-e"):
            opts["cleanenv"] = True
        elif flag == "--no-eval" and flavour.no_eval:
            opts["no_eval"] = True
        elif flag in ("--nv", "--rocm"):
            opts["nv"] = True
        elif flag == "--no-home":
            opts["no_home"] = True
        elif flag in ("--bind", "-B"):
            for item in value.split(","):
                src, _, rest = item.partition(":")
                opts["binds"].append((src, rest.split(":")[0] or src))
        elif flag == "--pwd":
            opts["pwd"] = value
        else:
            raise SimError(f"Error: unknown flag: {flag}", 255)
    if len(args) < 2:
        raise SimError("Error: requires at least 2 arg(s)", 255)
    return opts, args


def container_env(flavour: Flavour, host: dict[str, str], cleanenv: bool) -> tuple[dict, dict]:
    """(the process environment, the prefixed overrides), as create.go SetContainerEnv."""
    overrides: dict[str, str] = {}
    for prefix in flavour.prefixes:
        for key, value in host.items():
            name = key[len(prefix) :]
            if not key.startswith(prefix) or not name or name in overrides:
                continue
            if name == "PATH":
                overrides["SING_USER_DEFINED_PATH"] = value
            elif name not in NOT_OVERRIDABLE:
                overrides[name] = value
    env = {"LANG": "C"} if cleanenv else {}
    for key, value in host.items():
        if key.startswith(("APPTAINER", "SINGULARITY")) or key in overrides:
            continue
        if key in ALWAYS_PASS or (not cleanenv and key not in ALWAYS_OMIT):
            env[key] = value
    env["HOME"] = pwd.getpwuid(os.getuid()).pw_dir
    env["PATH"] = DEFAULT_PATH
    return env, overrides


def inject_script(overrides: dict[str, str], no_eval: bool) -> str:
    """The sourced snippet of injectEnvHandler, then 99-runtimevars' user-defined PATH."""
    lines = []
    for key, value in overrides.items():
        if key == "LD_LIBRARY_PATH" and value:
            value += ":/.singularity.d/libs"
        if no_eval:
            quoted = "'" + value.replace("'", "'\"'\"'") + "'"
        else:
            quoted = '"' + value.replace('"', '\\"') + '"'
        lines.append(f"export {key}={quoted}")
    lines.append(
        'if [ -n "${SING_USER_DEFINED_PATH:-}" ]; then export PATH="$SING_USER_DEFINED_PATH"; fi'
    )
    lines.append("unset SING_USER_DEFINED_PATH")
    return "\n".join(lines)


def default_binds(home: str, no_home: bool) -> list[tuple[str, str]]:
    """What Apptainer mounts unless told not to (user guide, "Bind Paths and Mounts", system
    defined binds; apptainer.conf `mount home`, `mount tmp`): the account's home (not with
    --no-home) and the current directory; /tmp as well, which the ch-run underneath already
    shares. A source that does not exist is left out, as Apptainer skips it with a warning."""
    here = os.getcwd()
    found = [] if no_home else [(home, home)]
    if here not in ("/", "/tmp", home) and not here.startswith("/tmp/"):
        found.append((here, here))
    return [(src, dst) for src, dst in found if os.path.isdir(src)]


def execute(flavour: Flavour, args: list[str]) -> int:
    opts, args = _parse_exec(flavour, args)
    image, command = args[0], args[1:]
    env, overrides = container_env(flavour, dict(os.environ), opts["cleanenv"])
    workdir = tempfile.mkdtemp(prefix="rootfs-", dir=_tmp_dir(flavour))
    rootfs = os.path.join(workdir, "root")
    try:
        if os.path.isdir(image):
            shutil.copytree(image, rootfs, symlinks=True)
        else:
            images.unpack(image, rootfs)
        script = (
            'for f in /.singularity.d/env/*.sh; do [ -r "$f" ] && . "$f"; done\n'
            + inject_script(overrides, opts["no_eval"])
            + '\nexec "$@"\n'
        )
        cwd = opts["pwd"] or os.getcwd()
        binds = [*default_binds(env["HOME"], opts["no_home"]), *opts["binds"]]
        return chrun.run(
            rootfs,
            ["/bin/sh", "-c", script, "sh", *command],
            env,
            binds,
            cwd,
            chrun.host_gpus(),
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
