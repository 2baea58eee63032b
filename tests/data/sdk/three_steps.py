"""A three-step pipeline for the SDK's tests: prepare on `cpu`, train on `1-gpu`, evaluate
on `half-gpu`, passing a real file and Python objects. Each step says who and where it ran."""

import getpass
import json
import os
import sys

import klique


def where() -> dict:
    return {
        "user": getpass.getuser(),
        "task": os.environ.get("KLIQUE_TASK_ID"),
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    }


@klique.step(resource="cpu", returns=("data", "meta"))
def prepare(rows):
    with open("data.csv", "w") as f:
        for i in range(rows):
            f.write(f"{i},{i * i}\n")
    return klique.File("data.csv"), {"rows": rows, "where": where()}


@klique.step(resource="1-gpu", returns=("model", "trained"))
def train(data, meta):
    with open(data) as f:
        squares = [int(line.split(",")[1]) for line in f.read().splitlines()]
    with open("model.txt", "w") as f:
        f.write(f"sum={sum(squares)} rows={meta['rows']}\n")
    return klique.File("model.txt"), {"where": where()}


@klique.step(resource="half-gpu")
def evaluate(model, meta, trained):
    with open(model) as f:
        text = f.read()
    return {
        "model": text,
        "ran": {"prepare": meta["where"], "train": trained["where"], "evaluate": where()},
    }


@klique.pipeline(name="three-steps", project="AI Engineering")
def flow(rows=4):
    data, meta = prepare(rows)
    model, trained = train(data, meta)
    return evaluate(model, meta, trained)


if __name__ == "__main__":
    if sys.argv[1:] == ["--remote"]:
        task = flow.remote(rows=5)
        if isinstance(task, klique.Task):  # here; in the controller's job, its result
            print(json.dumps({"pipeline": task.id}))
    else:
        print(json.dumps({"result": flow()}))
