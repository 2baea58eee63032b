"""What pyproject.toml cannot say: the package list. The batch templates live at the top of the
checkout (templates/) and ship as the package `klique_templates` (pyproject.toml maps the
folder), which package discovery alone would never find under that name."""

from setuptools import find_namespace_packages, setup

setup(
    packages=[
        *find_namespace_packages(include=["broker*", "inside_job*", "klique*"]),
        "klique_templates",
        "klique_deploy",  # deploy/: the service files (`klique deploy files DEST`)
        *(f"klique_templates.{kind}" for kind in find_namespace_packages("templates")),
    ],
)
