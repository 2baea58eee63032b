"""Interactive work: the app catalogue, launching apps as tasks, locks and running-app quotas."""
