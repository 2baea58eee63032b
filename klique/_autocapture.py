"""What `Task.init` captures by itself, each part switchable off: in the call
(`auto_connect_arg_parser=False`, `auto_connect_frameworks=False` or `{"matplotlib": False}`,
`auto_resource_monitoring=False`, ClearML's names) or for a whole site or job through its
environment variable (KLIQUE_CAPTURE_ARGPARSE=0 ...), which wins over the call.

- argparse: what `ArgumentParser.parse_args` (and `parse_known_args`) returns after Task.init
  is connected as the parameters `Args/NAME`; in a job the task's stored values (a clone's
  edited ones) come back from parse_args in their place.
- matplotlib: each figure `plt.show()` shows, and each `Figure.savefig` saves, is reported
  through the task's logger (a Plotly figure where plotly converts it, else a PNG).
- tensorboard, monitor: klique/_watch.py, sampled on a thread every few seconds.
- packages, git: the local run's record (klique/task.py)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Union

    from klique.logger import Logger

# Each part, and the environment variable that turns it off ("0", "false", "no", "off").
PARTS = ("argparse", "packages", "git", "matplotlib", "tensorboard", "monitor")
FRAMEWORKS = ("matplotlib", "tensorboard")
OFF_WORDS = ("0", "false", "no", "off")
ARGS_SECTION = "Args"  # ClearML's section for argparse's arguments


def variable(part: str) -> str:
    """The environment variable that switches `part` off: KLIQUE_CAPTURE_ARGPARSE..."""
    return f"KLIQUE_CAPTURE_{part.upper()}"


def switches(
    arg_parser: bool = True,
    frameworks: Union[bool, Dict[str, bool]] = True,
    monitoring: bool = True,
    environ: Optional[Mapping[str, str]] = None,
) -> Dict[str, bool]:
    """Which parts are on: what Task.init was given, less what the environment turns off."""
    variables: Mapping[str, str] = os.environ if environ is None else environ
    wanted = {part: True for part in PARTS}
    wanted["argparse"] = bool(arg_parser)
    wanted["monitor"] = bool(monitoring)
    for name in FRAMEWORKS:
        if isinstance(frameworks, dict):
            wanted[name] = bool(frameworks.get(name, True))
        else:
            wanted[name] = bool(frameworks)
    for part in PARTS:
        if variables.get(variable(part), "").strip().lower() in OFF_WORDS:
            wanted[part] = False
    return wanted


# argparse


def connect_arg_parser(connect: Callable[[Any, str], Any]) -> None:
    """From now on, what a parser returns goes through `connect(namespace, "Args")` (which
    records it and, in a job, writes the stored values back into it)."""
    import argparse  # on its path only: the switch may be off

    original = argparse.ArgumentParser.parse_known_args
    if getattr(original, "_klique", False):
        return
    depth = threading.local()

    def parse_known_args(self: Any, args: Any = None, namespace: Any = None) -> Any:
        depth.n = getattr(depth, "n", 0) + 1
        try:
            parsed, extras = original(self, args, namespace)
        finally:
            depth.n -= 1
        if depth.n == 0:  # the outermost parser: a subparser's result is part of it
            connect(parsed, ARGS_SECTION)
        return parsed, extras

    parse_known_args._klique = True  # type: ignore[attr-defined]
    argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]


# matplotlib


def report_matplotlib(logger: Logger) -> None:
    """Report the figures matplotlib shows or saves, now if it is imported, else once it is."""
    if "matplotlib.pyplot" in sys.modules:
        _patch_pyplot(sys.modules["matplotlib.pyplot"], logger)
    if "matplotlib.figure" in sys.modules:
        _patch_figure(sys.modules["matplotlib.figure"], logger)
    sys.meta_path.insert(
        0,
        _AfterImport(
            {
                "matplotlib.pyplot": lambda m: _patch_pyplot(m, logger),
                "matplotlib.figure": lambda m: _patch_figure(m, logger),
            }
        ),
    )


_reporting = threading.local()  # set while a figure is being reported: its own savefig is not


def _report_figure(logger: Logger, figure: Any, title: str) -> None:
    if getattr(_reporting, "on", False):
        return
    _reporting.on = True
    try:
        counts = _report_figure.counts  # type: ignore[attr-defined]
        iteration = counts.get(title, 0)
        counts[title] = iteration + 1
        logger.report_matplotlib_figure(title, "", figure, iteration=iteration)
    except Exception as exc:  # a figure the converter cannot take must not end the run
        sys.stderr.write(f"klique: could not report the figure {title!r}: {exc}\n")
    finally:
        _reporting.on = False


_report_figure.counts = {}  # type: ignore[attr-defined]


def figure_title(figure: Any, fallback: str) -> str:
    """A figure's title on the task's page: its suptitle, its first axes' title, or fallback."""
    suptitle = getattr(figure, "_suptitle", None)
    if suptitle is not None and suptitle.get_text():
        return str(suptitle.get_text())
    for axes in getattr(figure, "axes", []):
        if axes.get_title():
            return str(axes.get_title())
    return fallback


def _patch_pyplot(pyplot: Any, logger: Logger) -> None:
    original = pyplot.show
    if getattr(original, "_klique", False):
        return

    def show(*args: Any, **kwargs: Any) -> Any:
        for number in pyplot.get_fignums():
            figure = pyplot.figure(number)
            _report_figure(logger, figure, figure_title(figure, f"Figure {number}"))
        return original(*args, **kwargs)

    show._klique = True  # type: ignore[attr-defined]
    pyplot.show = show


def _patch_figure(module: Any, logger: Logger) -> None:
    original = module.Figure.savefig
    if getattr(original, "_klique", False):
        return

    def savefig(self: Any, fname: Any, *args: Any, **kwargs: Any) -> Any:
        done = original(self, fname, *args, **kwargs)
        if isinstance(fname, (str, os.PathLike)):
            fallback = os.path.basename(os.fspath(fname))
            _report_figure(logger, self, figure_title(self, fallback))
        return done

    savefig._klique = True  # type: ignore[attr-defined]
    module.Figure.savefig = savefig


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a function on a module once it is imported (ClearML's framework hooks do the same)."""

    def __init__(self, hooks: Dict[str, Callable[[Any], None]]) -> None:
        self.hooks = hooks

    def find_spec(self, name: str, path: Optional[Sequence[str]], target: Any = None) -> Any:
        hook = self.hooks.pop(name, None)
        if hook is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            hook(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
