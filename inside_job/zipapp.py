"""Build klique-runner.pyz: the zipapp of this package (and the `klique` SDK) that the broker
puts in a job directory."""

from __future__ import annotations

import os
import py_compile
import shutil
import tempfile
import zipapp as _zipapp

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# The researcher's SDK travels with the runner: `import klique` works in every job.
SDK_DIR = os.path.join(os.path.dirname(PACKAGE_DIR), "klique")
# zipapp's own main= wrapper drops the return value; this one makes it the exit status.
_ARCHIVE_MAIN = "import sys\nfrom inside_job.__main__ import main\nsys.exit(main())\n"


def _add_module(source: str, dest: str) -> None:
    """Copy a module with its bytecode beside it: zipimport cannot cache what it compiles.

    The .pyc serves interpreters of this version; others fall back to the .py source.
    """
    shutil.copy2(source, dest)
    py_compile.compile(
        dest,
        cfile=dest + "c",
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )


def build(dest: Path) -> Path:
    """Write the zipapp to dest (atomically) and return dest."""
    with tempfile.TemporaryDirectory(prefix="klique-pyz-") as tmp:
        for source in (PACKAGE_DIR, SDK_DIR):
            package = os.path.join(tmp, os.path.basename(source))
            os.mkdir(package)
            for name in sorted(os.listdir(source)):
                if name.endswith(".py"):
                    _add_module(os.path.join(source, name), os.path.join(package, name))
        with open(os.path.join(tmp, "__main__.py"), "w", encoding="utf-8") as f:
            f.write(_ARCHIVE_MAIN)
        partial = f"{dest}.{os.getpid()}.tmp"
        _zipapp.create_archive(tmp, partial, interpreter="/usr/bin/env python3", compressed=True)
        os.replace(partial, dest)
    return dest
