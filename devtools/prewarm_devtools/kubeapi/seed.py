"""Objects to seed the API server with, read from Kubernetes YAML or JSON files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from prewarm_devtools.kubeapi.registry import SeedError


def flatten(documents: list[Any], source: str) -> list[dict[str, Any]]:
    """Objects of `documents`, with `List`s (`kind: List`, `NodeList`, ...) expanded into their items."""
    objects: list[dict[str, Any]] = []
    for index, document in enumerate(documents):
        if document is None:
            continue
        if not isinstance(document, dict):
            raise SeedError(f"{source}: document #{index} is a {type(document).__name__}, not a Kubernetes object")
        kind = str(document.get("kind") or "")
        if kind.endswith("List") and isinstance(document.get("items"), list):
            # Items of a typed list (as the API returns them) carry no kind of their own.
            item_kind = kind[: -len("List")] if kind != "List" else None
            for item in document["items"]:
                if isinstance(item, dict) and item_kind and not item.get("kind"):
                    item = {"kind": item_kind, "apiVersion": document.get("apiVersion", "v1"), **item}
                objects.extend(flatten([item], source))
        else:
            objects.append(document)
    return objects


def load_objects(path: str | Path) -> list[dict[str, Any]]:
    """The objects of a YAML (multi-document allowed) or JSON file."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as e:
        raise SeedError(f"cannot read seed file {file}: {e.strerror}") from e
    try:
        documents = [json.loads(text)] if file.suffix == ".json" else list(yaml.safe_load_all(text))
    except (ValueError, yaml.YAMLError) as e:
        raise SeedError(f"seed file {file} is not valid {'JSON' if file.suffix == '.json' else 'YAML'}: {e}") from e
    return flatten(documents, str(file))
