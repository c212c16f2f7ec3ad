"""`ImageMetadata` as ECR answers it, for the services' unit tests: one layer count (and index, if any) for
every image, each question of layers recorded."""

from __future__ import annotations


class LayerCounts:
    """ECR's answers about images: `layers` for each (None: ECR cannot say); `asked` the questions."""

    def __init__(self, layers: int | None, platforms: list[dict[str, str]] | None = None,
                 size: int | None = None) -> None:
        self.layers = layers
        self.size = size  # every image's compressed bytes (None: ECR cannot say)
        self.sized: list[tuple[str, str, str]] = []  # each question of bytes
        self.index = platforms  # every image's manifest is an index of these (None: not an index)
        self.asked: list[tuple[str, str, str]] = []
        self.regions: list[str] = []  # where each question of layers was asked

    def platforms(self, registry_id: str, repository: str, digest: str, *,
                  region: str = "") -> list[dict[str, str]] | None:
        return None if self.index is None else [dict(p) for p in self.index]

    def layer_count(self, registry_id: str, repository: str, digest: str, *, region: str = "") -> int | None:
        self.asked.append((registry_id, repository, digest))
        self.regions.append(region)
        return self.layers

    def image_bytes(self, registry_id: str, repository: str, digest: str, *, region: str = "") -> int | None:
        self.sized.append((registry_id, repository, digest))
        return self.size
