"""A training script as ClearML's examples write one, for the automatic capture tests: its
argparse arguments, matplotlib figure and TensorBoard events are captured with nothing but
Task.init; where matplotlib and tensorboard are missing (a node's bare python3) it trains
without them."""

import argparse
import json
import os
import time

import klique

task = klique.Task.init(project_name="Capture", task_name="train", tags=["capture"])
parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()
print(f"training with lr={args.lr} epochs={args.epochs}", flush=True)

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
except ImportError:
    plt = None

if plt is not None:
    writer = EventFileWriter("runs/train")
    for epoch in range(args.epochs):
        value = summary_pb2.Summary.Value(tag="loss/train", simple_value=args.lr / (epoch + 1))
        event = event_pb2.Event(wall_time=time.time(), step=epoch)
        event.summary.value.append(value)
        writer.add_event(event)
    writer.close()
    plt.plot([3, 2, 1])
    plt.title("loss curve")
    plt.savefig("curve.png")

if os.environ.get("KLIQUE_MONITOR_INTERVAL_S"):  # wait for the monitor's second sample
    scalars = os.path.join(task.get_logger().folder or "", "scalars.jsonl")
    deadline = time.time() + 60
    while time.time() < deadline:
        with open(scalars, encoding="utf-8") as f:
            if any(json.loads(line).get("series") == "cpu %" for line in f):
                break
        time.sleep(0.2)
print("trained", task.id, flush=True)
