"""The web UI: server-rendered pages over the API's own functions and permissions, live
through one server-sent-events connection per page, with vendored htmx and uPlot (no build)."""
