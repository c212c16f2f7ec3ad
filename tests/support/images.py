"""`ImageMetadata` as ECR answers it, for the services' unit tests: one layer count for every image, each
question recorded."""

from __future__ import annotations


class LayerCounts:
    """ECR's answers about images: `layers` for each (None: ECR cannot say); `asked` the questions."""

    def __init__(self, layers: int | None) -> None:
        self.layers = layers
        self.asked: list[tuple[str, str, str]] = []

    def platforms(self, registry_id: str, repository: str, digest: str) -> list[dict[str, str]] | None:
        return None

    def layer_count(self, registry_id: str, repository: str, digest: str) -> int | None:
        self.asked.append((registry_id, repository, digest))
        return self.layers
