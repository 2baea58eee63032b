"""Pipelines for the SDK's tests: a cached step, a failing step, a step that runs long, a fan-out
of steps that are ready together. `steps_more.py NAME --remote` queues NAME's controller on the
estate's pipeline resource, as three_steps.py does."""

import json
import sys
import time

import klique


@klique.step(resource="cpu", cache=True)
def square(x):
    return {"square": x * x, "at": time.time()}


@klique.step(resource="cpu")
def add(a, b):
    return a["square"] + b


@klique.step(resource="cpu")
def explode(value):
    raise ValueError(f"bad batch {value}")


@klique.step(resource="cpu")
def wait(seconds):
    time.sleep(seconds)
    return seconds


@klique.step(resource="cpu")
def double(x):
    return 2 * x


@klique.step(resource="cpu")
def total(*parts):
    return sum(parts)


@klique.pipeline(name="cached", project="tests")
def cached(x=3):
    return add(square(x), 1)


@klique.pipeline(name="failing", project="tests")
def failing():
    return add(square(explode(7)), 1)


@klique.pipeline(name="long", project="tests")
def long():
    return wait(600)


@klique.pipeline(name="fan-out", project="tests")
def fan_out(n=6):
    return total(*[double(i) for i in range(n)])


if __name__ == "__main__":
    flows = {"cached": cached, "failing": failing, "long": long, "fan-out": fan_out}
    if sys.argv[2:] == ["--remote"]:
        task = flows[sys.argv[1]].remote()
        if isinstance(task, klique.Task):  # here; in the controller's job, its result
            print(json.dumps({"pipeline": task.id}), flush=True)
    else:
        print(flows[sys.argv[1]](), flush=True)
