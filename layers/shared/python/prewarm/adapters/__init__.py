"""Adapters to AWS, Kubernetes and CRI behind small protocols."""
