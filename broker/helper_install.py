"""Installing the helper program (broker/helper.py) that a server or `klique agent` runs
through sudo to act as a mapped account."""

from __future__ import annotations

from pathlib import Path

from broker import helper


def install_helper(path: Path, config: Path | None = None) -> Path:
    """Copy the helper program (broker/helper.py) to `path`, readable and runnable by all and
    writable by this account only; for a sudoers rule it must be owned by root. `config` fixes
    where the copy reads its job roots (helper.CONFIG by default): never from its caller."""
    source = Path(helper.__file__).read_bytes()
    if config is not None:
        fixed = f"CONFIG = {str(config.absolute())!r}\n".encode()
        source = source.replace(f'CONFIG = "{helper.CONFIG}"\n'.encode(), fixed, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(source)
    tmp.chmod(0o755)
    tmp.replace(path)
    return path
