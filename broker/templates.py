"""Batch templates: Jinja2 over templates/<kind>/, every value shell-quoted unless marked safe.

A compute resource's template is `<kind>/<resource>.sh.j2`, falling back to the pool's
named template, then `<kind>/default.sh.j2`. Templates may include shared partials.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from broker.errors import TemplateError

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"

# What a directive may contain: validated values only, never free text.
_DIRECTIVE = re.compile(r"^--?[A-Za-z][A-Za-z0-9_-]*([= ][A-Za-z0-9_.,:=/%@+\[\]\"-]+)?$")


def _quote(value: Any) -> str:
    if isinstance(value, Markup):
        return str(value)
    if isinstance(value, list | tuple):
        return " ".join(shlex.quote(str(v)) for v in value)
    return shlex.quote(str(value))


@functools.lru_cache(maxsize=16)
def environment(root: Path = TEMPLATES) -> jinja2.Environment:
    """One environment per folder, kept: it caches compiled templates (reloaded when edited)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(root)),
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
    if not _DIRECTIVE.match(directive):
        raise TemplateError(
            f"directive {directive!r} from {origin} is not allowed in a batch script; fix: use "
            '--name or --name=value with letters, digits and . , : = / % @ + - [ ] " only'
        )
    return Markup(directive)  # noqa: S704 - checked just above


def template_name(
    kind: str, resource: str, pool_template: str | None, root: Path = TEMPLATES
) -> str:
    for candidate in (
        f"{kind}/{resource}.sh.j2",
        f"{kind}/{pool_template}.sh.j2" if pool_template else None,
        f"{kind}/default.sh.j2",
    ):
        if candidate and (root / candidate).is_file():
            return candidate
    raise TemplateError(f"no batch template for {kind}: add {root / kind / 'default.sh.j2'}")


def render(name: str, context: Mapping[str, Any], root: Path = TEMPLATES) -> str:
    """Render a template; an error names the template file and line."""
    try:
        return environment(root).get_template(name).render(**context)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"{exc.filename or name}:{exc.lineno}: {exc.message}") from exc
    except jinja2.UndefinedError as exc:
        raise TemplateError(
            f"{root / name}:{_template_line(exc)}: {exc.message}; fix: use only "
            f"the variables listed in templates/README.md"
        ) from exc
    except jinja2.TemplateNotFound as exc:
        raise TemplateError(f"template {exc.name} not found under {root}") from exc


def _template_line(exc: BaseException) -> int | str:
    tb = exc.__traceback__
    line: int | str = "?"
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(".j2"):
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
