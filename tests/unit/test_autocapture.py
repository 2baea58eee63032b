"""What Task.init captures by itself: the switches (the call and the environment), argparse's
arguments connected (and a job's stored values back from parse_args), matplotlib's shown and
saved figures, TensorBoard's event files read on from where they stopped, and the resources of
the process tree from /proc."""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from klique import _autocapture, _watch
from klique.logger import Logger

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP8z8DAwMDAxMDAwMDAAAANHQEDasKb6QAAAABJRU5ErkJggg=="
)


def lines(folder: Path, name: str) -> list[dict]:
    path = folder / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_each_part_is_on_by_default_and_off_by_the_call_or_the_environment() -> None:
    assert all(_autocapture.switches(environ={}).values())
    off = _autocapture.switches(False, {"matplotlib": False}, False, environ={})
    assert [p for p, on in off.items() if not on] == ["argparse", "matplotlib", "monitor"]
    environ = {"KLIQUE_CAPTURE_TENSORBOARD": "0", "KLIQUE_CAPTURE_PACKAGES": "off"}
    site = _autocapture.switches(environ=environ)
    assert [p for p, on in site.items() if not on] == ["packages", "tensorboard"]
    assert _autocapture.switches(environ={"KLIQUE_CAPTURE_GIT": "1"})["git"]
    assert _autocapture.variable("monitor") == "KLIQUE_CAPTURE_MONITOR"


def test_what_a_parser_returns_is_connected_and_the_stored_values_come_back() -> None:
    connected: list[tuple[dict, str]] = []

    def connect(namespace: argparse.Namespace, name: str) -> None:
        connected.append((dict(vars(namespace)), name))
        namespace.lr = 0.01  # what a clone's stored value does to it (Task.connect)

    original = argparse.ArgumentParser.parse_known_args
    try:
        _autocapture.connect_arg_parser(connect)
        _autocapture.connect_arg_parser(connect)  # once only
        parser = argparse.ArgumentParser()
        parser.add_argument("--lr", type=float, default=0.1)
        commands = parser.add_subparsers(dest="command")
        commands.add_parser("train").add_argument("--epochs", type=int, default=3)
        args = parser.parse_args(["--lr", "0.5", "train", "--epochs", "4"])
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
    assert connected == [({"lr": 0.5, "command": "train", "epochs": 4}, "Args")]
    assert args.lr == 0.01


def test_figures_shown_or_saved_are_reported_once_each(tmp_path: Path) -> None:
    # A fresh interpreter: matplotlib imported after the hook, as in a script after Task.init.
    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from klique import _autocapture
from klique.logger import Logger
_autocapture.report_matplotlib(Logger({str(tmp_path)!r}))
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
plt.plot([1, 2, 3])
plt.title("loss curve")
plt.show()
figure = plt.figure()
figure.suptitle("weights")
figure.savefig({str(tmp_path / "weights.png")!r})
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    reports = lines(tmp_path, "reports.jsonl")
    assert [(r["kind"], r["title"], r["iteration"]) for r in reports] == [
        ("image", "loss curve", 0),
        ("image", "weights", 0),
    ]
    assert base64.b64decode(reports[0]["content"])[:4] == b"\x89PNG"


class Events:
    """TensorBoard event files written torch-free, with tensorboard's own writer."""

    def __init__(self, folder: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.writer = EventFileWriter(str(folder))

    def add(self, step: int, *values: object) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        summary = summary_pb2.Summary(value=list(values))  # type: ignore[arg-type]
        self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
        self.writer.flush()

    @staticmethod
    def scalar(tag: str, value: float) -> object:
        from tensorboard.compat.proto import summary_pb2

        return summary_pb2.Summary.Value(tag=tag, simple_value=value)

    @staticmethod
    def tensor_scalar(tag: str, value: float) -> object:
        """A scalar as TensorFlow 2 writes one: a tensor of the scalars plugin."""
        from tensorboard.compat.proto import summary_pb2, tensor_pb2, types_pb2

        metadata = summary_pb2.SummaryMetadata()
        metadata.plugin_data.plugin_name = "scalars"
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[value])
        return summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=metadata)

    @staticmethod
    def image(tag: str, content: bytes) -> object:
        from tensorboard.compat.proto import summary_pb2

        image = summary_pb2.Summary.Image(height=2, width=2, colorspace=3)
        image.encoded_image_string = content
        return summary_pb2.Summary.Value(tag=tag, image=image)


def test_tensorboard_events_are_read_as_scalars_and_images_each_once(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    runs, out = tmp_path / "runs" / "exp1", tmp_path / "out"
    runs.mkdir(parents=True)
    out.mkdir()
    writer = Events(runs)
    writer.add(1, Events.scalar("loss/train", 0.5), Events.scalar("accuracy", 0.75))
    writer.add(1, Events.image("samples/val", PNG), Events.image("noise", b"not an image"))
    files = _watch.EventFiles([str(tmp_path / "runs"), str(tmp_path)], time.time())
    logger = Logger(str(out))
    files.report(logger)
    writer.add(2, Events.scalar("loss/train", 0.25), Events.tensor_scalar("lr", 0.125))
    files.report(logger)
    files.report(logger)
    scalars = [
        (s["name"], s.get("series", ""), s["step"], s["value"]) for s in lines(out, "scalars.jsonl")
    ]
    assert scalars == [
        ("loss", "train", 1, 0.5),
        ("accuracy", "accuracy", 1, 0.75),
        ("loss", "train", 2, 0.25),
        ("lr", "lr", 2, 0.125),
    ]
    images = lines(out, "reports.jsonl")
    assert [(r["kind"], r["title"], r["series"], r["iteration"]) for r in images] == [
        ("image", "samples", "val", 1)
    ]
    assert base64.b64decode(images[0]["content"]) == PNG


def test_event_files_older_than_the_run_are_not_read(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    Events(tmp_path).add(1, Events.scalar("old", 1.0))
    files = _watch.EventFiles([str(tmp_path)], time.time() + 60)
    out = tmp_path / "out"
    out.mkdir()
    files.report(Logger(str(out)))
    assert lines(out, "scalars.jsonl") == []


def test_the_process_tree_is_read_from_proc_stat() -> None:
    line = "42 (a (b) c) S 7 42 42 0 -1 4194560 500 0 0 0 150 50 3 1 20 0 1 0 100 2000 77 rest"
    assert _watch.parse_stat(line) == (7, 200.0, 77)
    assert _watch.parse_stat("1 (x) S 0") is None
    stats = {1: (0, 1.0, 1), 2: (1, 2.0, 2), 3: (2, 4.0, 4), 4: (9, 8.0, 8)}
    assert sorted(_watch.process_tree(1, stats)) == [(0, 1.0, 1), (1, 2.0, 2), (2, 4.0, 4)]


def child_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parsed = _watch.parse_stat(f.read())
    assert parsed is not None
    return parsed[1] / os.sysconf("SC_CLK_TCK")


def test_the_monitor_samples_cpu_and_memory_of_the_tree_and_no_gpu_without_nvml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        resources = _watch.Resources(os.getpid())
        first = dict(resources.sample())
        started, child_started = time.time(), child_cpu_s(child.pid)
        deadline = started + 30
        while child_cpu_s(child.pid) - child_started < 0.5 and time.time() < deadline:
            time.sleep(0.1)
        child_used = child_cpu_s(child.pid) - child_started
        later = dict(resources.sample())
        elapsed = time.time() - started
    finally:
        child.kill()
        child.wait()
    assert list(first) == ["memory MiB"] and first["memory MiB"] > 10
    # The busy child is part of the tree: the tree used at least what the child did.
    assert later["cpu %"] >= 100 * child_used / elapsed - 1, (later, child_used, elapsed)
    assert child_used >= 0.5
    assert not any(name.startswith("gpu") for name in later)  # no GPU here: silently none

    monkeypatch.setenv(_watch.INTERVAL_VARIABLE, "0.5")
    out = tmp_path / "out"
    out.mkdir()
    watcher = _watch.Watcher(Logger(str(out)), True, False, [])
    deadline = time.time() + 30
    while len(lines(out, "scalars.jsonl")) < 3 and time.time() < deadline:
        time.sleep(0.1)
    watcher.close()
    series = {(s["name"], s["series"]) for s in lines(out, "scalars.jsonl")}
    assert series == {(":monitor:", "cpu %"), (":monitor:", "memory MiB")}


def test_the_interval_is_a_setting_with_a_floor() -> None:
    assert _watch.interval_s({}) == 5.0
    assert _watch.interval_s({"KLIQUE_MONITOR_INTERVAL_S": "2"}) == 2.0
    assert _watch.interval_s({"KLIQUE_MONITOR_INTERVAL_S": "0"}) == 0.5
    assert _watch.interval_s({"KLIQUE_MONITOR_INTERVAL_S": "often"}) == 5.0


def test_each_gpu_is_sampled_through_nvml_where_it_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML as nvidia-ml-py's pynvml gives it (no GPU on this machine: a stand-in module)."""
    fake = types.ModuleType("pynvml")
    vars(fake).update(
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=40 + h),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=(h + 1) << 30),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    found = dict(_watch.Resources(os.getpid()).sample())
    assert {k: v for k, v in found.items() if k.startswith("gpu")} == {
        "gpu0 utilisation %": 40.0,
        "gpu0 memory MiB": 1024.0,
        "gpu1 utilisation %": 41.0,
        "gpu1 memory MiB": 2048.0,
    }

    def no_driver() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    vars(fake)["nvmlInit"] = no_driver
    found = dict(_watch.Resources(os.getpid()).sample())
    assert list(found) == ["memory MiB"]  # CPU and memory only, silently
