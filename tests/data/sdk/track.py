"""A tracked run for the SDK's tests: Task.init, parameters, scalars, artifacts; with
`--remote RESOURCE` it sends itself to that compute resource and goes on there."""

import getpass
import json
import os
import sys

import klique

task = klique.Task.init(project="AI Engineering", name="track")
params = task.connect({"lr": 0.1, "epochs": 3})
if sys.argv[1:2] == ["--remote"]:
    task.execute_remotely(resource=sys.argv[2])
print("running as", getpass.getuser(), "in task", os.environ.get("KLIQUE_TASK_ID"), flush=True)
for epoch in range(params["epochs"]):
    task.log.scalar("loss", params["lr"] / (epoch + 1), step=epoch)
with open("weights.bin", "wb") as f:
    f.write(bytes(range(256)) * 4)
task.upload_artifact("weights", "weights.bin")
task.upload_artifact("summary", {"params": params, "user": getpass.getuser()})
print(json.dumps({"task": task.id, "params": params}))
