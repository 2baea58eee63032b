"""ClearML's OutputModel over the registry: each update_weights registers a new version of the
model, made by the task (klique/models.py does the work)."""

from __future__ import annotations

import os

from klique._api import KliqueError
from klique.models import Model, check_name
from klique.task import Task

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional


class OutputModel:
    """ClearML's OutputModel: each update_weights registers a new version of `name`, made by
    `task` (the current task by default)."""

    def __init__(
        self,
        task: Optional[Task] = None,
        name: Optional[str] = None,
        framework: Optional[str] = None,
        tags: Optional[List[str]] = None,
        metadata: Optional[Dict[str, Any]] = None,
    ) -> None:
        found = task or Task.current()
        if found is None:
            raise KliqueError("OutputModel needs a task: call klique.Task.init() first")
        self.task = found
        self.name = check_name(name or found.record.get("name") or "model")
        self.framework = framework
        self.tags = tags
        self.metadata = metadata
        self.model: Optional[Model] = None

    def update_weights(self, weights_filename: str) -> Model:
        """A new version: one file."""
        if not os.path.isfile(weights_filename):
            raise KliqueError(f"{weights_filename} is not a file; update_weights takes a file")
        return self._register(weights_filename)

    def update_weights_package(self, weights_path: str) -> Model:
        """A new version: a folder of files."""
        if not os.path.isdir(weights_path):
            raise KliqueError(f"{weights_path} is not a folder; update_weights_package takes one")
        return self._register(weights_path)

    def _register(self, path: str) -> Model:
        self.model = self.task.register_model(
            self.name, path, framework=self.framework, metadata=self.metadata, tags=self.tags
        )
        return self.model
