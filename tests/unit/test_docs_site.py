"""The docs site (mkdocs.yml, docs/hooks/): the README is its front page, short, with the two
commands first; the reference pages are written from the code and miss none of it; and the
whole site builds with `--strict`, nothing in it fetched from outside."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import yaml

from broker.estate import EstateFile
from broker.pools.registry import kinds

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def hook(name: str) -> ModuleType:
    """A hook of docs/hooks/, which is no package: MkDocs loads its files by path, and so do we."""
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", ROOT / "docs/hooks" / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_short_and_shows_the_two_commands_first():
    lines = README.splitlines()
    assert len(lines) < 250
    first_block = README.split("```")[1]
    assert "make demo" in first_block and "make test" in first_block
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[0] == "## Two commands"


def test_every_page_the_readme_links_is_a_page_of_the_site():
    linked = set(re.findall(r"\]\(docs/([^)#]+\.md)", README))
    assert linked, "the README links no docs pages"
    missing = sorted(page for page in linked if not (ROOT / "docs" / page).is_file())
    assert missing == []
    front = hook("readme.py").front_page(README)
    assert "](docs/" not in front and "](security.md)" in front


def test_every_page_in_docs_is_in_the_nav():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)

    def pages(nav: object) -> set[str]:
        """The nav is a page, a {title: nav} mapping or a list of navs."""
        if isinstance(nav, str):
            return {nav}
        items = list(nav.values()) if isinstance(nav, dict) else nav
        assert isinstance(items, list), nav
        return set().union(*(pages(item) for item in items))

    in_nav = pages(config["nav"])
    on_disk = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk - in_nav == set()


def test_the_estate_reference_names_every_field_and_every_pool_kind():
    page = hook("reference.py").estate_page()
    for field in EstateFile.model_fields:
        assert f"| `{field}` |" in page
    for name, spec in kinds().items():
        assert f"## Pools of kind `{name}`" in page
        for field in spec.settings.model_fields:
            assert f"| `{field}` |" in page, (name, field)


def test_the_rest_reference_names_every_operation_of_the_openapi_document():
    reference = hook("reference.py")
    document = reference.openapi_document()
    page = reference.rest_page(document)
    for path, operations in document["paths"].items():
        for method in operations:
            if method in reference.METHODS:
                assert f"### `{method.upper()} {path}`" in page
    for name in document["components"]["schemas"]:
        assert f"### {name}\n" in page


def test_type_words_of_a_json_schema():
    type_of = hook("reference.py").type_of
    assert type_of({"$ref": "#/$defs/ServerFile"}) == "[ServerFile](#serverfile)"
    assert type_of({"anyOf": [{"type": "string"}, {"type": "null"}]}) == "string or null"
    assert type_of({"type": "array", "items": {"type": "integer"}}) == "list of integer"
    named = {"type": "object", "patternProperties": {"^x$": {"$ref": "#/$defs/PolicyFile"}}}
    assert type_of(named) == "mapping of name to [PolicyFile](#policyfile)"


def test_the_site_builds_strict_and_fetches_nothing(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for page in ("index.html", "reference/cli/index.html", "reference/estate/index.html"):
        assert (site / page).is_file()
    cli = (site / "reference/cli/index.html").read_text()
    assert "klique submit" in cli
    for html in site.rglob("*.html"):
        external = re.findall(
            r"<(?:script|link)[^>]+(?:src|href)=\"https?://[^\"]+", html.read_text()
        )
        assert external == [], html
