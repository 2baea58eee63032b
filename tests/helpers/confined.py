"""klique-helper as a test installs it: a copy made by `install_helper`, with its configuration
fixed into it at install time and listing the test's job roots, in a folder every account can
read and only its owner can write (the helper refuses a configuration anyone else could change)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from broker.helper_install import install_helper


def helper_config(roots: Sequence[Path | str], scheduler_path: str | None = None) -> str:
    """The helper's configuration: one job root a line, and `path=` where one is given."""
    lines = [str(root) for root in roots]
    if scheduler_path is not None:
        lines.append(f"path={scheduler_path}")
    return "\n".join(lines) + "\n"


def write_config(
    config: Path, roots: Sequence[Path | str], scheduler_path: str | None = None
) -> None:
    """The configuration at `config`, mode 644 (its owner: whoever runs the tests, root there)."""
    config.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    staged = config.with_name(f".{config.name}.new")
    staged.write_text(helper_config(roots, scheduler_path))
    staged.chmod(0o644)
    staged.replace(config)


@contextmanager
def confined_helper(
    roots: Sequence[Path | str], scheduler_path: str | None = None
) -> Iterator[Path]:
    """An installed helper whose configuration lists `roots`; removed after."""
    folder = Path(tempfile.mkdtemp(prefix="klique-helper-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        config = folder / "helper.conf"
        write_config(config, roots, scheduler_path)
        yield install_helper(folder / "klique-helper", config)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
