"""A task's `image`, parsed once and written the way each container runtime reads it.

One task's image may be run by any runtime, and they disagree on syntax:

- Apptainer / SingularityCE (`apptainer build`, "Docker/OCI" sources): `docker://[REGISTRY/]IMAGE
  [:TAG][@sha256:DIGEST]`, Docker Hub when no registry is named; credentials come from
  `apptainer registry login` or APPTAINER_DOCKER_USERNAME, never from the reference.
- enroot 3.x (doc/cmd/import.md, src/docker.sh `docker::import` up to v3.5):
  `docker://[USER@][REGISTRY#]IMAGE[:TAG]` only; no digests, and `REGISTRY/IMAGE` is read as a
  Docker Hub repository named REGISTRY/IMAGE.
- enroot 4.x (src/docker.sh `docker::_parse_uri`): the 3.x syntax and Docker's
  `REGISTRY/IMAGE`, both with `@sha256:`; this module writes the `#` form, which both read.
- Pyxis (`srun --container-image=[USER@][REGISTRY#]IMAGE[:TAG]`, README): enroot's syntax without
  `docker://`; a digest is kept and needs enroot 4 on the nodes.
- Charliecloud (`ch-run IMAGE`): a directory or a SquashFS file; registry references are pulled
  beforehand with ch-image and ch-convert.

A reference is checked against a strict grammar (Docker's distribution reference grammar, plus
enroot's `USER@` and `REGISTRY#`) before anything uses it, so that it is safe in a batch script.
"""

from __future__ import annotations

import re

RUNTIMES = ("charliecloud", "apptainer", "singularity", "enroot", "pyxis")

_USER = r"[A-Za-z0-9_.-]+"
_REGISTRY = (
    r"(?:(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)(?::[0-9]{1,5})?|[A-Za-z0-9-]+:[0-9]{1,5})"
)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = rf"{_COMPONENT}(?:/{_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}"
_REFERENCE = re.compile(
    rf"(?:docker://)?(?:(?P<user>{_USER})@(?!sha256:))?"
    rf"(?:(?P<hashreg>{_REGISTRY})#|(?P<slashreg>{_REGISTRY})/)?(?P<path>{_REPOSITORY})"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?"
)
# Paths a script may carry unquoted-safe: no spaces, quotes, `$`, `#`, `,` or `:`.
_PATH = re.compile(r"/[A-Za-z0-9_./+@%=-]*")
_FILE_SUFFIXES = {".sif": "sif", ".sqsh": "sqsh", ".sqfs": "sqfs"}


class ImageError(ValueError):
    """An image reference that cannot be used: the sentence says what and how to fix it."""


class ImageRef:
    """A registry reference: [USER@][REGISTRY]/REPOSITORY[:TAG][@DIGEST]."""

    def __init__(self, user: str, registry: str, repository: str, tag: str, digest: str) -> None:
        self.user = user
        self.registry = registry  # "" for Docker Hub
        self.repository = repository
        self.tag = tag
        self.digest = digest

    def __repr__(self) -> str:
        fields = (self.user, self.registry, self.repository, self.tag, self.digest)
        return f"ImageRef{fields!r}"


def is_local(image: str) -> bool:
    """A path on the node (an image file or directory), not a registry reference."""
    return image.startswith("/")


def local_kind(image: str) -> str:
    """'sif', 'sqsh', 'sqfs' or 'dir' for a local image path."""
    for suffix, kind in _FILE_SUFFIXES.items():
        if image.endswith(suffix):
            return kind
    return "dir"


def parse(image: str) -> ImageRef:
    """Parse a registry reference; ImageError names what is wrong."""
    match = _REFERENCE.fullmatch(image)
    if match is None:
        raise ImageError(
            f"image {image!r} is not a valid reference; fix: use REGISTRY/IMAGE[:TAG][@sha256:...] "
            "(lower-case repository, e.g. nvcr.io/nvidia/pytorch:24.01-py3) or an absolute path"
        )
    # Docker's rule: a first part with "." or ":" (or localhost) is a registry host.
    registry = match.group("hashreg") or match.group("slashreg") or ""
    return ImageRef(
        match.group("user") or "",
        registry,
        match.group("path"),
        match.group("tag") or "",
        match.group("digest") or "",
    )


def check(image: str) -> str:
    """The image unchanged if it is a strict reference or a plain absolute path; else ImageError.

    What passes may enter a batch script (it is still shell-quoted there)."""
    if is_local(image):
        if not _PATH.fullmatch(image) or "/../" in image + "/":
            raise ImageError(
                f"image path {image!r} may hold only letters, digits and _ . / + @ % = -; "
                "fix: rename the image file"
            )
        return image
    parse(image)
    return image


def for_runtime(image: str, runtime: str, version: tuple[int, ...] | None = None) -> str:
    """The reference as `runtime` (at `version`, where syntax differs by version) reads it."""
    check(image)
    if is_local(image):
        return _local_for(image, runtime)
    if runtime == "charliecloud":
        raise ImageError(
            f"Charliecloud runs image directories and .sqfs files, not {image!r}; fix: pull it "
            "with `ch-image pull` and `ch-convert` and give the path"
        )
    ref = parse(image)
    if runtime in ("apptainer", "singularity"):
        return _apptainer(ref, image, runtime)
    if runtime == "enroot":
        return "docker://" + _enroot(ref, image, version)
    if runtime == "pyxis":
        return _enroot(ref, image, (4,))
    raise ImageError(f"runtime {runtime!r} is unknown (one of {', '.join(RUNTIMES)})")


def _local_for(image: str, runtime: str) -> str:
    kind = local_kind(image)
    wanted = {
        "charliecloud": ("dir", "sqfs"),
        "apptainer": ("sif", "dir"),
        "singularity": ("sif", "dir"),
        "enroot": ("sqsh",),
        "pyxis": ("sqsh",),
    }[runtime]
    if kind not in wanted:
        names = " or ".join("a directory" if k == "dir" else f"a .{k} file" for k in wanted)
        raise ImageError(f"{runtime} runs {names}, not {image}; fix: convert the image")
    return image


def _apptainer(ref: ImageRef, image: str, runtime: str) -> str:
    if ref.user:
        raise ImageError(
            f"image {image!r} names a registry user, which {runtime} does not read from a "
            f"reference; fix: drop '{ref.user}@' and log in with `{runtime} registry login`"
        )
    name = f"{ref.registry}/{ref.repository}" if ref.registry else ref.repository
    name += f":{ref.tag}" if ref.tag else ""
    return "docker://" + name + (f"@{ref.digest}" if ref.digest else "")


def _enroot(ref: ImageRef, image: str, version: tuple[int, ...] | None) -> str:
    if ref.digest and (version is None or version < (4,)):
        shown = ".".join(str(v) for v in version) if version else "unknown"
        raise ImageError(
            f"image {image!r} is pinned by digest, which enroot {shown} cannot import (enroot 4 "
            "and later can); fix: use a tag, or install enroot 4 on the nodes"
        )
    text = f"{ref.user}@" if ref.user else ""
    text += f"{ref.registry}#" if ref.registry else ""
    text += ref.repository
    text += f":{ref.tag}" if ref.tag else ""
    return text + (f"@{ref.digest}" if ref.digest else "")


def parse_version(text: str) -> tuple[int, ...] | None:
    """'apptainer version 1.2.5', 'singularity-ce version 3.11.4-1.el8', '3.4.1' -> (1, 2, 5)..."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    return tuple(int(p) for p in match.groups() if p is not None)
