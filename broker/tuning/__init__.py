"""Tuning: a search over a base task's parameters. `specs` and `budget` are pure rules (the
client's CLI parses specs with them too); `study` is Optuna's side, the server's only."""
