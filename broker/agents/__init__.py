"""A pool's agent: it follows the pool's tasks, submits what placement gave it and reports what
the pool did, on its own cadence. It runs inside the server or as `klique agent` on a login node;
only its link to the control plane differs. Nothing here reads the store."""
