"""The model registry's pure rules: what a model's name and a file's path may be, what a
`registry:NAME@REF` launch parameter names, which version a reference picks, and what a change
of stage moves. No I/O; the store keeps the rows (broker/store/models.py) and the service
applies the rules for every adapter (broker/tasks/models.py)."""
