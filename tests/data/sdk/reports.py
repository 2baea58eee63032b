"""Every kind of report, with ClearML's names, for the reporting tests: run it with `--remote
RESOURCE` to send it to that compute resource, where the runner reports what it logs."""

import base64
import sys

import klique

PNG = [  # two 2x2 images, red and blue
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP8z8DAwMDAxMDAwMDAAAANHQEDasKb6QAAAABJRU5ErkJggg==",
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGNkYPjPwMDAxMDAwMDAAAALHwEDmIWXfgAAAABJRU5ErkJggg==",
]

task = klique.Task.init(
    project_name="Reports", task_name="every kind", auto_resource_monitoring=False
)
if sys.argv[1:2] == ["--remote"]:
    task.execute_remotely(queue_name=sys.argv[2])
log = task.get_logger()
for i in range(3):
    log.report_scalar("loss", "train", 1.0 / (i + 1), iteration=i)
    log.report_scalar("loss", "validation", 1.5 / (i + 1), iteration=i)
log.report_single_value("accuracy", 0.93)
log.report_table("metrics", "val", iteration=2, table_plot=[{"class": "cat", "f1": 0.8}])
for i, image in enumerate(PNG):
    with open(f"sample{i}.png", "wb") as f:
        f.write(base64.b64decode(image))
    log.report_image("samples", "val", iteration=i, local_path=f"sample{i}.png")
log.report_plotly("curve", "roc", {"data": [{"x": [0, 1], "y": [0, 1], "name": "roc"}]})
log.report_histogram("weights", "layer1", [3, 5, 2], iteration=2, xlabels=["-1", "0", "1"])
log.report_text("## Notes\n\n**done** <script>alert(1)</script>", markdown=True)
with open("clip.wav", "wb") as f:
    f.write(b"RIFF0000WAVE")
log.report_media("audio", "clip", iteration=2, local_path="clip.wav")
log.flush()
print("reported", task.id, flush=True)
