"""What the tuning page draws, computed here and rendered by the template: the objective over
the trials (uPlot, through the task page's chart code) and the trials' parallel coordinates as
plain SVG, drawn on the server (no script, so the page's CSP stays strict). Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

WIDTH, HEIGHT, PAD = 720, 260, 30


def objective_chart(trials: Sequence[dict[str, Any]], direction: str) -> dict[str, Any]:
    """Each completed trial's value, in the order trials ended, and the best so far."""
    done = sorted(
        (t for t in trials if t["state"] == "complete" and t["value"] is not None),
        key=lambda t: (t["ended_at"] or 0, t["number"]),
    )
    pick = min if direction == "minimize" else max
    values: list[list[float]] = []
    best: list[list[float]] = []
    for index, trial in enumerate(done):
        values.append([index, trial["value"]])
        best.append([index, pick(v for _, v in values)])
    series = [
        {"label": "trial's value", "points": values},
        {"label": "best so far", "points": best},
    ]
    return {"charts": [{"name": "objective, trials in the order they ended", "series": series}]}


def parallel(
    specs: Sequence[dict[str, Any]], trials: Sequence[dict[str, Any]], objective: str
) -> dict[str, Any]:
    """Axes (one per parameter, then the objective) and a line per trial, in SVG coordinates;
    a completed trial's line is darker the better its value (`rank` 0 is the best)."""
    names = [s["name"] for s in specs]
    count = len(names) + 1
    xs = [PAD + i * (WIDTH - 2 * PAD) / max(1, count - 1) for i in range(count)]
    values = [t["value"] for t in trials if t["state"] == "complete" and t["value"] is not None]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    axes = [
        {"x": x, "label": name, "low": _label(spec, 0), "high": _label(spec, 1)}
        for x, name, spec in zip(xs, names, specs, strict=False)
    ]
    axes.append({"x": xs[-1], "label": objective, "low": f"{low:.4g}", "high": f"{high:.4g}"})
    ranked = sorted(values)
    lines = []
    for trial in trials:
        points = [
            (x, _y(_fraction(spec, trial["params"].get(spec["name"]))))
            for x, spec in zip(xs, specs, strict=False)
        ]
        value = trial["value"] if trial["state"] == "complete" else None
        if value is not None:
            points.append((xs[-1], _y((value - low) / (high - low) if high > low else 0.5)))
        shade = ranked.index(value) / max(1, len(ranked) - 1) if value is not None else None
        lines.append(
            {
                "number": trial["number"],
                "state": trial["state"],
                "points": " ".join(f"{x:.1f},{y:.1f}" for x, y in points),
                "opacity": f"{1.0 - 0.75 * shade:.2f}" if shade is not None else "0.35",
            }
        )
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "top": PAD,
        "bottom": HEIGHT - PAD,
        "axes": axes,
        "lines": lines,
    }


def _fraction(spec: dict[str, Any], value: Any) -> float:
    """Where a value sits on its axis, 0 (low) to 1 (high)."""
    if value is None:
        return 0.5
    if spec["kind"] == "choice":
        choices = spec["choices"]
        index = choices.index(value) if value in choices else 0
        return index / max(1, len(choices) - 1) if len(choices) > 1 else 0.5
    low, high = float(spec["low"]), float(spec["high"])
    if spec["kind"] == "loguniform":
        low, high, value = math.log(low), math.log(high), math.log(max(float(value), 1e-300))
    return min(1.0, max(0.0, (float(value) - low) / (high - low)))


def _y(fraction: float) -> float:
    return HEIGHT - PAD - fraction * (HEIGHT - 2 * PAD)


def _label(spec: dict[str, Any], end: int) -> str:
    if spec["kind"] == "choice":
        return str(spec["choices"][-1 if end else 0])
    return f"{spec['high' if end else 'low']:.4g}"
