"""What `Task.connect` and `Task.connect_configuration` accept with ClearML's names, as the flat
parameters Klique stores: a dict, an argparse.Namespace or any object's public attributes
(under `name/` when named), and a configuration (a dict, or a file's text) as one parameter."""

from __future__ import annotations

import json
import os
import tempfile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Tuple

SIMPLE = (str, int, float, bool, type(None), list, dict)


def flat(obj: Any, name: str = "") -> Tuple[Dict[str, Any], Callable[[Dict[str, Any]], None]]:
    """The parameters of `obj` (keys under `name/` if given), and how to write values back."""
    prefix = f"{name}/" if name else ""
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise TypeError("connect() takes a dict with string keys")
        values = {prefix + k: v for k, v in obj.items()}

        def into_dict(stored: Dict[str, Any]) -> None:
            for key in list(obj):
                obj[key] = stored.get(prefix + key, obj[key])

        return values, into_dict
    fields = {k: v for k, v in vars(obj).items() if not k.startswith("_") and _simple(v)}
    values = {prefix + k: v for k, v in fields.items()}

    def into_object(stored: Dict[str, Any]) -> None:
        for key in fields:
            setattr(obj, key, stored.get(prefix + key, getattr(obj, key)))

    return values, into_object


def configuration_value(configuration: Any) -> Tuple[Any, bool]:
    """A configuration as one parameter's value: a dict as is, a file's text (True: a file)."""
    if isinstance(configuration, dict):
        return json.loads(json.dumps(configuration)), False
    path = os.fspath(configuration)
    with open(path, encoding="utf-8") as f:
        return f.read(), True


def configuration_file(original: str, text: str) -> str:
    """The configuration file to read: the original, or a copy with the task's stored text
    (a clone's edited configuration) where the two differ."""
    with open(original, encoding="utf-8") as f:
        if f.read() == text:
            return original
    suffix = os.path.splitext(original)[1]
    fd, path = tempfile.mkstemp(prefix="klique-configuration-", suffix=suffix)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _simple(value: Any) -> bool:
    return isinstance(value, SIMPLE) and not callable(value)
