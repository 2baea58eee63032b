"""`klique deploy files DEST`: the service files that ship with Klique copied out for a site to
adapt: the systemd units of the server and the agent, nginx's site, the server's Containerfile
(the checkout's deploy/, installed as the package `klique_deploy`; docs/install.md)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import click


def shipped() -> Path:
    """Where the service files are: the installed package `klique_deploy`, else the checkout's
    top-level deploy/ (an editable install maps no package onto that folder)."""
    spec = importlib.util.find_spec("klique_deploy")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(__file__).resolve().parents[2] / "deploy"


def service_files(folder: Path) -> list[Path]:
    """The files under `folder`, as paths relative to it, in order."""
    found = (path for path in folder.rglob("*") if path.is_file())
    return sorted(p.relative_to(folder) for p in found if "__pycache__" not in p.parts)


@click.group()
def deploy() -> None:
    """The files a site installs Klique's services with."""


@deploy.command("files")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace files of the same names in DEST.")
def files(dest: Path, force: bool) -> None:
    """Copy the systemd units, nginx's site and the Containerfile into DEST (made if need be),
    to adapt and install as docs/install.md says."""
    source = shipped()
    names = service_files(source)
    if not names:
        raise click.ClickException(
            f"no service files in {source}; fix: reinstall klique (the package ships them)"
        )
    there = [str(name) for name in names if (dest / name).exists()]
    if there and not force:
        raise click.ClickException(
            f"{dest} already holds {', '.join(there)}; fix: name an empty folder, or add "
            "--force to replace them"
        )
    for name in names:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, dest / name)
    click.echo(f"{len(names)} files in {dest}:")
    for name in names:
        click.echo(f"  {name}")
