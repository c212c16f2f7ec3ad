"""pytest fixtures for the local servers: the embedded Kubernetes API and private containerd nodes."""
