"""A training run that registers model `demo`: a version with each text given, the first
through task.register_model, the rest through ClearML's OutputModel.update_weights; with
`--remote RESOURCE` first, it sends itself to that compute resource and registers there, with
its job's report token."""

import json
import sys

import klique

task = klique.Task.init(project="models", name="train")
texts = sys.argv[1:]
if texts[:1] == ["--remote"]:
    task.execute_remotely(resource=texts[1])
    texts = texts[2:]
versions = []
for index, text in enumerate(texts):
    with open("weights.txt", "w", encoding="utf-8") as f:
        f.write(text)
    if index == 0:
        made = task.register_model("demo", "weights.txt", framework="text", tags=["first"])
    else:
        made = klique.OutputModel(task=task, name="demo", framework="text").update_weights(
            weights_filename="weights.txt"
        )
    versions.append(made.version)
same = klique.Model.get("demo", version=versions[-1]).get_local_copy()
with open(same, encoding="utf-8") as f:
    read_back = f.read()
print(json.dumps({"versions": versions, "read_back": read_back}))
