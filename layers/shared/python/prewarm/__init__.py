"""Prewarm: put container images on the right Kubernetes nodes before pods need them."""

__version__ = "0.1.0"
