"""What a run's thread samples every few seconds (KLIQUE_MONITOR_INTERVAL_S, default 5): its
resources, as scalars under the title `:monitor:` (CPU % and resident memory of the task's
process tree from /proc; each GPU's utilisation and memory through NVML where nvidia-ml-py and
a GPU are there, else nothing of them, silently), and the TensorBoard event files the task
writes under its working folder and job folder, read as scalars and images with tensorboard's
own reader where the task's environment has it. Each is switchable off (klique/_autocapture.py);
what it reports meets the task's report bounds like any report."""

from __future__ import annotations

import math
import os
import sys
import threading
import time

from klique.logger import Logger, image_type

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterator, List, Optional, Tuple

MONITOR_TITLE = ":monitor:"
DEFAULT_INTERVAL_S = 5.0
INTERVAL_VARIABLE = "KLIQUE_MONITOR_INTERVAL_S"
EVENTS_PREFIX = "events.out.tfevents."
MAX_EVENT_FILES = 256  # event files followed at once: a folder of thousands is not walked each tick
MAX_WALK_ENTRIES = 20000  # folders and files looked at per search: a huge cwd costs a bounded time
MIB = 1024 * 1024


def interval_s(environ: Optional[Dict[str, str]] = None) -> float:
    """The sampling period: KLIQUE_MONITOR_INTERVAL_S (at least 0.5 s), else 5 s."""
    raw = (os.environ if environ is None else environ).get(INTERVAL_VARIABLE, "")
    try:
        return max(0.5, float(raw)) if raw.strip() else DEFAULT_INTERVAL_S
    except ValueError:
        return DEFAULT_INTERVAL_S


class Watcher:
    """A daemon thread: a resource sample and the new TensorBoard events every interval, and
    once more at close() (Task.close, Logger.flush and the end of the process call it)."""

    def __init__(
        self, logger: Logger, monitor: bool, tensorboard: bool, folders: List[str]
    ) -> None:
        self.logger = logger
        self.started = time.time()
        self.resources = Resources(os.getpid()) if monitor else None
        self.events = EventFiles(folders, self.started) if tensorboard else None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="klique-watch", daemon=True)
        self._interval = interval_s()
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.tick()

    def tick(self) -> None:
        """One sample, and what the event files hold that is new."""
        with self._lock:
            try:
                if self.resources is not None:
                    step = int(time.time() - self.started)
                    for series, value in self.resources.sample():
                        self.logger.report_scalar(MONITOR_TITLE, series, value, step)
                if self.events is not None:
                    self.events.report(self.logger)
            except Exception as exc:  # a sample that fails must not end the run
                sys.stderr.write(f"klique: monitoring stopped: {exc}\n")
                self.resources = self.events = None

    def flush(self) -> None:
        """Read the event files now (Logger.flush)."""
        if self.events is not None:
            with self._lock:
                self.events.report(self.logger)

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(2.0)
        self.resources = None  # the last sample is the one of the last tick
        self.tick()


# Resources


class Resources:
    """CPU % (100: one core) and resident memory of a process and its descendants, from /proc;
    GPUs through NVML when it loads."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._last: Optional[Tuple[float, float]] = None  # (wall time, CPU seconds)
        self.gpus = _nvml()

    def sample(self) -> List[Tuple[str, float]]:
        tree = process_tree(self.pid, _proc_stats())
        cpu_s = sum(stat[1] for stat in tree) / self.ticks
        rss = sum(stat[2] for stat in tree) * self.page
        now = time.time()
        found: List[Tuple[str, float]] = []
        if self._last is not None and now > self._last[0]:
            percent = 100.0 * (cpu_s - self._last[1]) / (now - self._last[0])
            found.append(("cpu %", round(max(0.0, percent), 1)))
        self._last = (now, cpu_s)
        found.append(("memory MiB", round(rss / MIB, 1)))
        return found + self.gpus()


def _proc_stats() -> Dict[int, Tuple[int, float, int]]:
    """{pid: (parent pid, CPU ticks of user and system, resident pages)} from /proc."""
    stats: Dict[int, Tuple[int, float, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return stats
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                text = f.read()
        except OSError:
            continue  # gone meanwhile
        parsed = parse_stat(text)
        if parsed is not None:
            stats[int(name)] = parsed
    return stats


def parse_stat(text: str) -> Optional[Tuple[int, float, int]]:
    """(ppid, utime + stime, rss pages) of one /proc/PID/stat line (proc(5)); the command's
    name is in parentheses and may hold spaces, so fields are counted after its last ')'."""
    _, _, rest = text.rpartition(")")
    fields = rest.split()
    if len(fields) < 22:
        return None
    try:  # fields 4, 14, 15 and 24 of the line: the 2nd, 12th, 13th and 22nd after ')'
        return int(fields[1]), float(int(fields[11]) + int(fields[12])), int(fields[21])
    except ValueError:
        return None


def process_tree(
    root: int, stats: Dict[int, Tuple[int, float, int]]
) -> List[Tuple[int, float, int]]:
    """The stats of `root` and of every process under it."""
    children: Dict[int, List[int]] = {}
    for pid, stat in stats.items():
        children.setdefault(stat[0], []).append(pid)
    found, todo, seen = [], [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        found.append(stats[pid])
        todo.extend(children.get(pid, []))
    return found


def _nvml() -> Any:
    """A function giving each GPU's (series, value) pairs; one giving none where NVML does not
    load (no nvidia-ml-py, no driver, no GPU)."""
    try:
        import pynvml  # nvidia-ml-py, where the task's environment has it
    except ImportError:
        return list
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # pynvml.NVMLError: no driver or no GPU here
        return list

    def sample() -> List[Tuple[str, float]]:
        found: List[Tuple[str, float]] = []
        for index, handle in enumerate(handles):
            rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            found.append((f"gpu{index} utilisation %", float(rates.gpu)))
            found.append((f"gpu{index} memory MiB", round(memory.used / MIB, 1)))
        return found

    return sample


# TensorBoard


class EventFiles:
    """The event files written since the run started under these folders, each read on from
    where the last read stopped."""

    def __init__(self, folders: List[str], since: float) -> None:
        self.folders = [f for i, f in enumerate(folders) if f and f not in folders[:i]]
        self.since = since - 1.0  # a file made in the second the run started counts
        self.loaders: Dict[str, Any] = {}
        self.reader = _tensorboard_reader()

    def report(self, logger: Logger) -> None:
        if self.reader is None:
            return
        for path in sorted(set(self._files())):
            if path not in self.loaders:
                if len(self.loaders) >= MAX_EVENT_FILES:
                    continue
                self.loaders[path] = self.reader(path)
            for event in self.loaders[path].Load():
                for item in event_items(event):
                    _report_item(logger, item)

    def _files(self) -> Iterator[str]:
        for path in event_files(self.folders):
            try:
                if os.stat(path).st_mtime >= self.since:
                    yield path
            except OSError:
                continue


def event_files(folders: List[str]) -> Iterator[str]:
    """Every TensorBoard event file under these folders (a bounded walk)."""
    seen = 0
    for folder in folders:
        for top, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
            seen += len(dirs) + len(files)
            for name in files:
                if name.startswith(EVENTS_PREFIX):
                    yield os.path.join(top, name)
            if seen > MAX_WALK_ENTRIES:
                return


def event_items(event: Any) -> Iterator[Tuple[str, str, int, Any]]:
    """(kind, tag, step, value) of one event: ("scalar", tag, step, float), ("image", tag,
    step, bytes) — in TensorBoard's old fields (simple_value, image) and its tensors."""
    summary = event.summary if event.HasField("summary") else None
    if summary is None:
        return
    step = int(event.step)
    for value in summary.value:
        field = value.WhichOneof("value")
        plugin = value.metadata.plugin_data.plugin_name
        if field == "simple_value":
            yield "scalar", value.tag, step, float(value.simple_value)
        elif field == "image":
            yield "image", value.tag, step, bytes(value.image.encoded_image_string)
        elif field == "tensor" and plugin == "scalars":
            yield "scalar", value.tag, step, _tensor_number(value.tensor)
        elif field == "tensor" and plugin == "images":
            for index, encoded in enumerate(value.tensor.string_val[2:]):
                tag = value.tag if index == 0 else f"{value.tag}/{index}"
                yield "image", tag, step, bytes(encoded)


def _tensor_number(tensor: Any) -> float:
    try:  # tensorboard is there: its reader loaded
        from tensorboard.util import tensor_util
    except ImportError:
        return math.nan
    return float(tensor_util.make_ndarray(tensor).item())


def _report_item(logger: Logger, item: Tuple[str, str, int, Any]) -> None:
    """A TensorBoard tag `a/b` is the chart `a`, line `b` (ClearML reads them so too)."""
    kind, tag, step, value = item
    title, _, series = tag.rpartition("/")
    title, series = (title, series) if title else (tag, tag)
    if kind == "scalar":
        logger.report_scalar(title, series, value, step)
        return
    media_type = image_type(value)
    if media_type is not None:  # PNG or JPEG, as the page shows them
        logger._report_file("image", title, series, step, value, media_type, {"name": tag})


def _tensorboard_reader() -> Any:
    """tensorboard's EventFileLoader where the task's environment has tensorboard, else None."""
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    except ImportError:
        return None
    return EventFileLoader
