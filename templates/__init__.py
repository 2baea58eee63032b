"""The batch templates Klique ships, one folder per pool kind plus shared partials; installed
as the package `klique_templates` so that `importlib.resources` finds them (broker/templates.py)."""
