"""Staging the registry's model versions an app's launch resolved (`registry:NAME@REF`): each
version's files are downloaded with the task's report token into the job's folder, checked
against their SHA-256, and the reference in the command and environment becomes the local
path (the file, for a model of one file; else its folder). The server lets the token read
those versions only."""

from __future__ import annotations

import os
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request

from inside_job.digests import sha256_of
from inside_job.errors import SetupFailed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List

    from inside_job.jobfiles import Console
    from inside_job.prepared import Prepared
    from inside_job.spec import ReportSpec, TaskSpec

MODELS_DIR = "models"
CHUNK = 1 << 20
TIMEOUT_S = 60.0
# As the server checks them (broker/models/rules.py): a name, and a path of plain names.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._ +-]{0,254}$")


class StagedModel:
    """One resolved version, as task.json's app.models lists it."""

    def __init__(self, raw: object) -> None:
        if not isinstance(raw, dict):
            raise SetupFailed("app.models: each entry must be an object")
        self.ref = str(raw.get("ref") or "")
        self.name = str(raw.get("name") or "")
        self.version = raw.get("version")
        self.kind = raw.get("kind")
        files = raw.get("files")
        if not _NAME.match(self.name) or ".." in self.name or not isinstance(self.version, int):
            raise SetupFailed(f"app.models: {self.name!r} is not a model name with a version")
        if self.kind not in ("file", "folder") or not isinstance(files, list) or not files:
            raise SetupFailed(f"app.models: model {self.name} has no files")
        self.files: List[dict] = [_checked_file(f, self.name) for f in files]


def _checked_file(raw: object, name: str) -> dict:
    if not isinstance(raw, dict) or not isinstance(raw.get("path"), str):
        raise SetupFailed(f"app.models: a file of model {name} has no path")
    parts = raw["path"].split("/")
    if not all(_PART.match(p) for p in parts):
        raise SetupFailed(f"app.models: model {name}'s file {raw['path']!r} is not a plain path")
    if not isinstance(raw.get("digest"), str) or not re.match(r"^[0-9a-f]{64}$", raw["digest"]):
        raise SetupFailed(f"app.models: model {name}'s file {raw['path']!r} has no digest")
    return raw


def stage(spec: TaskSpec, prepared: Prepared, console: Console) -> None:
    """Every resolved version on this node; their references replaced by local paths."""
    assert spec.app is not None
    if not spec.app.models:
        return
    if spec.report is None:
        raise SetupFailed(
            "this app serves a registry model but its job cannot reach the Klique API (no "
            "report URL); ask the platform team to let the nodes reach the server"
        )
    for model in [StagedModel(raw) for raw in spec.app.models]:
        local = _stage_one(spec.job_dir, spec.report, model, console)
        prepared.argv = [arg.replace(model.ref, local) for arg in prepared.argv]
        # The app's env is filled again when its port is known (inside_job/prepare.py): the
        # local path goes into the app's own env, which that filling starts from.
        spec.app.env = {k: v.replace(model.ref, local) for k, v in spec.app.env.items()}


def _stage_one(job_dir: str, report: ReportSpec, model: StagedModel, console: Console) -> str:
    folder = os.path.join(job_dir, MODELS_DIR, model.name, f"v{model.version}")
    console.say(f"staging model {model.name} version {model.version} ({model.ref})")
    for index, file in enumerate(model.files):
        dest = os.path.join(folder, *file["path"].split("/"))
        os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
        if os.path.isfile(dest) and sha256_of(dest) == file["digest"]:
            continue  # staged by an earlier attempt in this folder
        quoted = urllib.parse.quote(model.name)
        url = f"{report.url}/api/v1/models/{quoted}/versions/{model.version}/files/{index}"
        _download(url, report.token, dest, file["digest"], model)
    first = os.path.join(folder, *model.files[0]["path"].split("/"))
    return first if model.kind == "file" else folder


def _download(url: str, token: str, dest: str, digest: str, model: StagedModel) -> None:
    partial = dest + ".partial"
    # The report URL is http(s) (inside_job/spec.py checks it): no file: or custom schemes.
    request = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})  # noqa: S310
    try:
        answer = urllib.request.urlopen(request, timeout=TIMEOUT_S)  # noqa: S310
        with answer, open(partial, "wb") as out:
            shutil.copyfileobj(answer, out, CHUNK)
        if sha256_of(partial) != digest:
            raise SetupFailed(f"model {model.name} version {model.version} arrived damaged")
        os.replace(partial, dest)
    except urllib.error.HTTPError as exc:
        raise SetupFailed(
            f"the server refused model {model.name} version {model.version} (HTTP {exc.code})"
        ) from None
    except OSError as exc:
        raise SetupFailed(
            f"could not fetch model {model.name} version {model.version}: {exc}"
        ) from None
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
