"""A training script in the style of ClearML's examples: argparse, TensorBoard and
matplotlib, recorded with `Task.init` and sent to a queue (a compute resource) with
`execute_remotely`. Only the import line differs from ClearML's (`from clearml import Task`).

    python3 train_with_tensorboard.py --lr 0.2 --epochs 5 --queue cpu

Task.init captures the arguments (the parameters Args/...), the TensorBoard events and the
matplotlib figures where the job's Python has tensorboard and matplotlib; without them the
script reports the same scalars through the logger.
"""

import argparse
import math
import os

from klique import Task

try:  # on a node whose Python has them
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
except ImportError:
    plt = None


def tensorboard_scalar(writer, tag, value, step):
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
    writer.add_event(event_pb2.Event(step=step, summary=summary))


def main():
    parser = argparse.ArgumentParser(description="fit y = 2x with gradient descent")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate")
    parser.add_argument("--epochs", type=int, default=3, help="epochs to train")
    parser.add_argument("--queue", default=None, help="run remotely on this queue")
    task = Task.init(project_name="examples", task_name="train with tensorboard")
    args = parser.parse_args()
    if args.queue:
        task.execute_remotely(queue_name=args.queue)

    logger = task.get_logger()
    writer = EventFileWriter("runs") if plt is not None else None
    weight, losses = 0.0, []
    for epoch in range(args.epochs):
        gradient = sum(2 * (weight * x - 2 * x) * x for x in range(1, 5)) / 4
        weight -= args.lr * gradient / 10
        loss = sum((weight * x - 2 * x) ** 2 for x in range(1, 5)) / 4
        losses.append(loss)
        if writer is not None:
            tensorboard_scalar(writer, "loss/train", loss, epoch)
        else:
            logger.report_scalar("loss", "train", loss, iteration=epoch)
        logger.report_scalar("weight", "w", weight, iteration=epoch)
    if writer is not None:
        writer.close()
        plt.plot(range(args.epochs), losses)
        plt.title("loss curve")
        plt.savefig("loss.png")
    logger.report_single_value("final loss", losses[-1])
    digits = math.log10(losses[-1] + 1e-12)
    logger.report_text(f"trained {args.epochs} epochs in {os.getcwd()}; log10 loss {digits:.2f}")
    print(f"final loss {losses[-1]:.6f}")


if __name__ == "__main__":
    main()
