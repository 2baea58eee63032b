"""The app catalogue: one YAML file per app beside the estate (or the built-in `apps/`), validated
with pydantic and JSON Schema; every problem names the file, line, field and fix.

An app's `command`, `env` and `upstream_headers` may hold placeholders: `{PARAM}` for a launch
form parameter, and `{gpus}`, `{route}`, `{base_url}`, `{task_name}` filled at launch
(broker/apps/launch.py); `{port}` and `{secret}` are left for the runner, which picks a free port
on the node and a secret per run (docs/job-directory.md).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from broker.domain import Estate
from broker.errors import EstateError
from broker.names import IMAGE, LINE, NAME, NO_NUL
from broker.yaml_lines import LineMap, describe

BUILT_IN = Path(__file__).resolve().parent.parent / "app_catalogue"
PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]{0,63})\}")
# Filled at launch from the compute resource and the route; the runner fills RUNNER_FILLED.
LAUNCH_FILLED = frozenset({"gpus", "route", "base_url", "task_name"})
RUNNER_FILLED = frozenset({"port", "secret"})
PARAM = r"^[a-z_][a-z0-9_]{0,63}$"
Text = Annotated[str, Field(pattern=LINE, max_length=4096)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AppFile(_Strict):
    name: str | None = Field(None, pattern=NAME)
    kind: Literal["session", "endpoint"]
    description: Text = ""
    resources: list[Annotated[str, Field(pattern=NAME)]] = []
    form: dict[str, Any] = {"type": "object", "properties": {}}
    requirements: list[Text] = []
    image: str | None = Field(None, pattern=IMAGE)
    command: list[Annotated[str, Field(pattern=NO_NUL, max_length=131072)]] = Field(min_length=1)
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")], Text] = {}
    upstream_headers: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,64}$")], Text] = {}
    ready_path: Text = "/"
    path: Literal["keep", "strip"] = "strip"


@dataclass(frozen=True)
class App:
    """One app of the catalogue, as launch and the API use it."""

    name: str
    kind: str  # session | endpoint
    description: str
    resources: tuple[str, ...]
    form: dict[str, Any]  # a JSON Schema of the launch parameters (an object)
    requirements: tuple[str, ...]
    image: str | None
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    upstream_headers: dict[str, str] = field(default_factory=dict)
    ready_path: str = "/"
    path: str = "strip"  # keep: the app sees /routes/NAME/...; strip: it sees the rest
    source: str = ""

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.form.get("properties") or {})


def catalogue_folder(estate: Estate) -> Path:
    return Path(estate.apps.catalogue) if estate.apps.catalogue else BUILT_IN


def load_catalogue(estate: Estate) -> dict[str, App]:
    """The estate's catalogue (read once per folder and estate); EstateError lists problems."""
    return _load(catalogue_folder(estate), tuple(sorted(estate.resources)))


@functools.lru_cache(maxsize=8)
def _load(folder: Path, resources: tuple[str, ...]) -> dict[str, App]:
    if not folder.is_dir():
        raise EstateError(
            [
                f"{folder}: the app catalogue folder does not exist; fix: create it, or remove "
                "apps.catalogue from the estate to use the built-in catalogue"
            ]
        )
    apps: dict[str, App] = {}
    problems: list[str] = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            app = parse_app(path.read_text(), str(path), set(resources))
        except EstateError as exc:
            problems += exc.problems
            continue
        if app.name in apps:
            problems.append(
                f"{path}:1: name: app {app.name!r} is also defined in "
                f"{apps[app.name].source}; fix: give each app its own name"
            )
        apps[app.name] = app
    if problems:
        raise EstateError(problems)
    return apps


def parse_app(text: str, source: str, resources: set[str] | None = None) -> App:
    """One app file, checked: its schema, its form, its placeholders, its compute resources."""
    lines = LineMap(text, source)
    if not isinstance(lines.data, dict):
        raise EstateError([f"{source}:1: an app file must be a mapping with kind: and command:"])
    try:
        model = AppFile.model_validate(lines.data)
    except ValidationError as exc:
        raise EstateError([describe(err, lines) for err in exc.errors()]) from None
    problems = [lines.error(at, message) for at, message in _check(model, resources)]
    if problems:
        raise EstateError(problems)
    name = model.name or Path(source).stem
    return App(
        name=name,
        kind=model.kind,
        description=model.description,
        resources=tuple(model.resources),
        form=_closed(model.form),
        requirements=tuple(model.requirements),
        image=model.image,
        command=tuple(model.command),
        env=dict(model.env),
        upstream_headers=dict(model.upstream_headers),
        ready_path=model.ready_path,
        path=model.path,
        source=source,
    )


def _closed(form: dict[str, Any]) -> dict[str, Any]:
    """A form takes only the parameters it names."""
    return {"additionalProperties": False, **form}


def _check(model: AppFile, resources: set[str] | None) -> list[tuple[tuple[str, ...], str]]:
    problems: list[tuple[tuple[str, ...], str]] = []
    try:
        Draft202012Validator.check_schema(model.form)
    except SchemaError as exc:
        at = ("form", *(str(p) for p in exc.path))
        return [(at, f"not a valid JSON Schema: {exc.message}; fix: see json-schema.org")]
    if model.form.get("type") != "object":
        problems.append((("form",), "must be a JSON Schema with type: object; fix: add it"))
    params = dict(model.form.get("properties") or {})
    for param in params:
        if not re.fullmatch(PARAM, param):
            problems.append(
                (
                    ("form", "properties", param),
                    "a parameter name must be lowercase letters, digits and _; fix: rename it",
                )
            )
    known = set(params) | LAUNCH_FILLED | RUNNER_FILLED
    places: list[tuple[tuple[str, ...], str]] = [
        (("command", str(i)), text) for i, text in enumerate(model.command)
    ]
    places += [(("env", k), v) for k, v in model.env.items()]
    places += [(("upstream_headers", k), v) for k, v in model.upstream_headers.items()]
    places += [(("ready_path",), model.ready_path)]
    for at, text in places:
        for name in PLACEHOLDER.findall(text):
            if name not in known:
                problems.append(
                    (
                        at,
                        f"{{{name}}} is neither a form parameter nor one of "
                        f"{', '.join(sorted(LAUNCH_FILLED | RUNNER_FILLED))}; fix: add it to "
                        "form.properties, or correct its spelling",
                    )
                )
        if at[0] == "command" and "{secret}" in text:
            problems.append(
                (
                    at,
                    "{secret} may not be on the command line (other accounts on the node can "
                    "read it); fix: pass it in env",
                )
            )
    for i, resource in enumerate(model.resources):
        if resources is not None and resource not in resources:
            problems.append(
                (
                    ("resources", str(i)),
                    f"compute resource {resource!r} is not in the estate; "
                    "fix: name one of its resources",
                )
            )
    if not model.ready_path.startswith(("/", "{")):
        problems.append((("ready_path",), "must start with /; fix: write it like /health"))
    return problems
