"""Pipelines for the SDK's tests: a cached step, a failing step, a step that runs long."""

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


@klique.pipeline(name="cached", project="tests")
def cached(x=3):
    return add(square(x), 1)


@klique.pipeline(name="failing", project="tests")
def failing():
    return add(square(explode(7)), 1)


@klique.pipeline(name="long", project="tests")
def long():
    return wait(600)


if __name__ == "__main__":
    print({"cached": cached, "failing": failing, "long": long}[sys.argv[1]](), flush=True)
