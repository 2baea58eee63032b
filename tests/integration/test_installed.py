"""Klique as `pip install klique` gives it (a wheel, not an editable checkout): the built-in
batch templates ship inside the package, so previews and submissions work from it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import ROOT


def test_the_installed_package_renders_batch_scripts(installed_klique: Path) -> None:
    estate = ROOT / "examples" / "estate.yaml"
    klique = str(installed_klique / "klique")
    shown = subprocess.run(
        [klique, "template", "render", "-r", "1-gpu", "--estate", str(estate)],
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
    )
    assert shown.returncode == 0, shown.stderr
    assert "#SBATCH --gres=gpu:1" in shown.stdout and "klique-runner.pyz" in shown.stdout
    checked = subprocess.run(
        [klique, "estate", "check", "--file-only", str(estate)],
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
    )
    assert checked.returncode == 0, checked.stderr
    used = [line for line in checked.stdout.splitlines() if line.startswith("template for")]
    assert used and "site-packages/klique_templates/slurm/default.sh.j2" in used[0], used
