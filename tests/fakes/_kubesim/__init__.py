"""The Kubernetes emulator of the tests: one API server and one node whose kubelet runs pods in
Podman (tests/fakes/kubernetes/kube-emulator is its entry; main.py documents what it serves)."""
