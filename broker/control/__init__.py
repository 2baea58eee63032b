"""The control plane the server runs: the placement loop over the pools' snapshots, the queue
and the held tasks it reads from the store, and its own side of the agents' link."""
