"""MkDocs hook: the README is the site's front page (index.md), its links to docs/ pages and
to SECURITY.md rewritten to the pages they are on the site, so the README stays the one source."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]

# On GitHub the README links docs/PAGE.md; on the site the same page is PAGE.md.
REWRITES = ((re.compile(r"\]\(docs/"), "]("), (re.compile(r"\]\(SECURITY\.md\)"), "](security.md)"))


def front_page(readme: str) -> str:
    for pattern, replacement in REWRITES:
        readme = pattern.sub(replacement, readme)
    return readme


def on_files(files: Files, config: Any) -> Files:
    text = front_page((ROOT / "README.md").read_text())
    files.append(File.generated(config, "index.md", content=text))
    return files
