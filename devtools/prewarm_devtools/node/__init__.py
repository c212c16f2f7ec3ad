"""Node test harness: a private containerd, a local registry, OCI image builder, throttling proxy."""
