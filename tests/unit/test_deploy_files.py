"""`klique deploy files DEST`: the service files a site adapts (the systemd units, nginx's site,
the Containerfile) copied out of the package, byte for byte; files already in DEST are kept
unless --force says otherwise, with a refusal that names them and the fix."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from broker.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_the_service_files_are_copied_out_and_kept_unless_forced(tmp_path: Path) -> None:
    dest = tmp_path / "site"
    runner = CliRunner()
    done = runner.invoke(main, ["deploy", "files", str(dest)])
    assert done.exit_code == 0, done.output
    for name in ("Containerfile", "systemd/klique-server.service", "nginx/klique.conf"):
        assert (dest / name).read_bytes() == (ROOT / "deploy" / name).read_bytes()
        assert f"  {name}\n" in done.output

    (dest / "Containerfile").write_text("# the site's own\n")
    again = runner.invoke(main, ["deploy", "files", str(dest)])
    assert again.exit_code != 0
    assert "already holds Containerfile" in again.output and "--force" in again.output
    assert (dest / "Containerfile").read_text() == "# the site's own\n"

    forced = runner.invoke(main, ["deploy", "files", "--force", str(dest)])
    assert forced.exit_code == 0, forced.output
    assert (dest / "Containerfile").read_bytes() == (ROOT / "deploy/Containerfile").read_bytes()
