"""The task service: the operations on tasks (create one or many, show, list, logs, why,
cancel, clone, artifacts) over the store and the estate, with broker/authz.py's rules. The
REST API, the web UI, MCP and the SDK's endpoints adapt it; none of them imports another,
and none reaches past it to the control loop.

    control.py     what the service asks of the control loop (a Protocol the ControlLoop meets)
    service.py     TaskService: submit, listing, show, why, logs, cancel, a runner's report;
                   and over the modules below, batches, the SDK's records and artifacts
    apps.py        AppService: the catalogue, launches, running apps, stop, locks, routes
    cancelling.py  a cancel that reaches the steps a task made (a pipeline's)
    create.py      the checks every new task passes, whatever path made it
    creations.py   single creates of concurrent requests, written together
    batches.py     batches and sweeps: all items checked, all made or none
    records.py     the SDK's operations: local runs, steps, clones, reuse, parameters
    artifacts.py   who reads and writes a task's artifacts, and the room it has left
    console.py     a task's console: from its job folder as its account, or the reported copy
    views.py       presenters: TaskOut and WhyOut, as every adapter shows a task
    overview.py    resources, usage and a policy simulation, as a caller sees them
    schemas.py     request and response bodies (sdk_schemas.py: the SDK's; app_schemas.py:
                   the apps')

Every operation raises Klique's own errors (broker/errors.py); each adapter answers them its
way (REST: broker/http/errors.py's table of statuses)."""
