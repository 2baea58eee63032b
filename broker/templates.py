"""Batch templates: Jinja2 over `<kind>/` folders, every value shell-quoted unless marked safe.

A compute resource's template is `<kind>/<resource>.sh.j2`, falling back to the pool's
named template, then `<kind>/default.sh.j2`. The site's own folder (the estate's
`templates_dir`) is searched first, with the same fallbacks, then the templates that ship with
Klique (the checkout's templates/, installed as the package `klique_templates`); templates may
include shared partials from either.
"""

from __future__ import annotations

import functools
import importlib.resources
import os
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from broker.errors import TemplateError
from broker.names import has_control


def _built_in() -> Path:
    """Where the shipped templates are: the installed package `klique_templates`, else the
    checkout's top-level templates/ (an editable install maps no package onto that folder)."""
    try:
        return Path(str(importlib.resources.files("klique_templates")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "templates"


BUILT_IN = _built_in()

# What a directive may contain: validated values only, never free text (matched whole).
_DIRECTIVE = re.compile(r"--?[A-Za-z][A-Za-z0-9_-]*([= ][A-Za-z0-9_.,:=/%@+\[\]\"-]+)?")


def _quote(value: Any) -> str:
    """Every value a template prints: shell-quoted, and never one with a control character
    (a newline would start a new script line or directive, whatever the template does)."""
    if isinstance(value, list | tuple):
        return " ".join(_quote(v) for v in value)
    text = str(value)
    if has_control(text):
        raise TemplateError(
            f"value {text!r} holds a control character and cannot enter a batch script; "
            "fix: only validated names reach templates (see templates/README.md)"
        )
    return text if isinstance(value, Markup) else shlex.quote(text)


@dataclass(frozen=True)
class TemplateFile:
    """The template a compute resource uses on a pool: its name, and the file it is."""

    name: str  # <kind>/<file>.sh.j2, as includes and the loader name it
    path: Path
    root: int = 0  # which of the search roots holds it

    @property
    def key(self) -> str:
        """Its name for the environment: this very file, whatever the other roots hold."""
        return f"{self.root}/{self.name}"


def search_roots(site: str | None) -> tuple[Path, ...]:
    """Where templates are looked for: the site's folder first, then the built-in ones."""
    return (Path(site).expanduser(), BUILT_IN) if site else (BUILT_IN,)


class _SearchPath(jinja2.FileSystemLoader):
    """Folders searched in order, where a compiled template stays good only while it is both
    unchanged and still the first match (a site may add a template, or a partial, at any time)."""

    def get_source(
        self, environment: jinja2.Environment, template: str
    ) -> tuple[str, str, Callable[[], bool]]:
        source, filename, uptodate = super().get_source(environment, template)

        def still_first() -> bool:
            return bool(uptodate is None or uptodate()) and self._first(template) == filename

        return source, filename, still_first

    def _first(self, template: str) -> str | None:
        for root in self.searchpath:
            path = os.path.normpath(os.path.join(root, *template.split("/")))
            if os.path.isfile(path):
                return path
        return None


@functools.lru_cache(maxsize=16)
def environment(roots: tuple[Path, ...] = (BUILT_IN,)) -> jinja2.Environment:
    """One environment per search path, kept: it caches compiled templates (reloaded when
    edited)."""
    exact = {str(i): jinja2.FileSystemLoader(str(root)) for i, root in enumerate(roots)}
    env = jinja2.Environment(
        # "<root>/<kind>/<file>" names one file; includes search the roots in order.
        loader=jinja2.ChoiceLoader(
            [jinja2.PrefixLoader(exact), _SearchPath([str(root) for root in roots])]
        ),
        undefined=jinja2.StrictUndefined,
        finalize=_quote,
        autoescape=False,  # noqa: S701 - shell quoting is done by finalize, not HTML escaping
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env


def safe_directive(directive: str, origin: str) -> Markup:
    """A directive that may enter a script as it is; anything else is refused."""
    if not _DIRECTIVE.fullmatch(directive):
        raise TemplateError(
            f"directive {directive!r} from {origin} is not allowed in a batch script; fix: use "
            '--name or --name=value with letters, digits and . , : = / % @ + - [ ] " only'
        )
    return Markup(directive)  # noqa: S704 - checked just above


def find_template(
    kind: str, resource: str, pool_template: str | None, roots: tuple[Path, ...] = (BUILT_IN,)
) -> TemplateFile:
    """The first of `<kind>/<resource>`, the pool's template and `<kind>/default`, in the
    site's folder, then in the built-in one."""
    candidates = [f"{kind}/{resource}.sh.j2", f"{kind}/default.sh.j2"]
    if pool_template:
        candidates.insert(1, f"{kind}/{pool_template}.sh.j2")
    for index, root in enumerate(roots):
        for candidate in candidates:
            if (root / candidate).is_file():
                return TemplateFile(candidate, root / candidate, index)
    where = " or ".join(str(root / kind / "default.sh.j2") for root in roots)
    raise TemplateError(f"no batch template for {kind}: add {where}")


def render(
    template: TemplateFile, context: Mapping[str, Any], roots: tuple[Path, ...] = (BUILT_IN,)
) -> str:
    """Render a template; an error names the template file and line."""
    try:
        return environment(roots).get_template(template.key).render(**context)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"{exc.filename or template.path}:{exc.lineno}: {exc.message}") from exc
    except jinja2.UndefinedError as exc:
        raise TemplateError(
            f"{template.path}:{_template_line(exc)}: {exc.message}; fix: use only "
            f"the variables listed in {BUILT_IN / 'README.md'}"
        ) from exc
    except jinja2.TemplateNotFound as exc:
        places = ", ".join(str(root) for root in roots)
        raise TemplateError(f"template {exc.name} not found under {places}") from exc


def _template_line(exc: BaseException) -> int | str:
    tb = exc.__traceback__
    line: int | str = "?"
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(".j2"):
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
