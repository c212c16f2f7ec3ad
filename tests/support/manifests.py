"""ImagePullJob manifests as people write them: a dict for the use cases, YAML text for the CLI."""

from __future__ import annotations

import textwrap
from typing import Any

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/ml/llm@sha256:" + "a" * 64
NODES = ("node-a", "node-b", "node-c")


def job_doc(name: str = "warm", **spec: Any) -> dict[str, Any]:
    """An ImagePullJob `default/<name>` of `IMAGE`; `spec` adds or replaces fields of its spec."""
    return {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"image": IMAGE, **spec}}


def job_yaml(name: str, *, nodes: tuple[str, ...] = NODES, parallelism: int = 3, image: str = "nginx:1.25",
             completion: str = "Always", namespace: str = "default") -> str:
    """An ImagePullJob on named nodes, as YAML."""
    names = ", ".join(nodes)
    return textwrap.dedent(f"""\
        apiVersion: apps.kruise.io/v1alpha1
        kind: ImagePullJob
        metadata:
          name: {name}
          namespace: {namespace}
        spec:
          image: {image}
          parallelism: {parallelism}
          selector:
            names: [{names}]
          completionPolicy:
            type: {completion}
        """)
