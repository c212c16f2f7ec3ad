"""`prewarm install`: the agent DaemonSet, its RBAC and the functions' RBAC, rendered from a stack's
outputs (`render`) and applied through the Kubernetes API (`apply`)."""
