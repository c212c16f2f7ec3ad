"""Byte progress of a pull from containerd's in-flight downloads (its content store's ingests).

The CRI says nothing while a pull runs. containerd's content service lists every download it is
writing, named `<kind>-<digest>` (`layer-sha256:…`) in 1.6 and later, with the bytes written so far
(`offset`) and the blob's size (`total`). A pull's layers are known from its manifest, so each ingest
maps to the pulls that need that digest. A download that disappears after it was seen has been
committed (a cancelled pull's downloads disappear too, but then the pull ends first).

Without the manifest (the registry could not be asked), the layers being downloaded are credited to a
pull only while it is the only one running on the node; otherwise its progress is unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

# containerd's remotes.MakeRefKey prefixes; only layers count towards a pull's bytes.
LAYER_REF_PREFIX = "layer-"


class Ingest(Protocol):
    """One in-flight download as containerd reports it (`IngestStatus` has these fields)."""

    @property
    def ref(self) -> str: ...

    @property
    def offset(self) -> int: ...

    @property
    def total(self) -> int: ...


@dataclass(frozen=True)
class Progress:
    """Bytes of a pull's layers downloaded so far, of `bytes_total` (None when the total is unknown)."""

    bytes_done: int
    bytes_total: int | None


def layer_digest(ref: str) -> str | None:
    """The digest a layer ingest ref names (`layer-sha256:ab…` → `sha256:ab…`), else None."""
    if not ref.startswith(LAYER_REF_PREFIX):
        return None
    digest = ref[len(LAYER_REF_PREFIX) :]
    algorithm, colon, encoded = digest.partition(":")
    return digest if algorithm and colon and encoded else None


class ProgressTracker:
    """Follows one pull's layers through successive samples of the ingest list.

    Not thread-safe: one sampler calls `observe`; `expect` may be called once the manifest is known.
    """

    def __init__(self) -> None:
        self._expected: dict[str, int] | None = None
        self._offsets: dict[str, int] = {}
        self._totals: dict[str, int] = {}
        self._committed: set[str] = set()

    @property
    def layers_known(self) -> bool:
        """True once the pull's layers (from its manifest) are known."""
        return self._expected is not None

    def expect(self, layers: Mapping[str, int]) -> None:
        """The pull's layers: digest → compressed size, from the resolved manifest."""
        self._expected = dict(layers)
        for digest in list(self._offsets):
            if digest not in self._expected:
                self._forget(digest)

    def _forget(self, digest: str) -> None:
        self._offsets.pop(digest, None)
        self._totals.pop(digest, None)
        self._committed.discard(digest)

    def _wants(self, digest: str, exclusive: bool) -> bool:
        if self._expected is not None:
            return digest in self._expected
        # A layer once credited stays this pull's even when other pulls start.
        return exclusive or digest in self._offsets

    def observe(self, ingests: Iterable[Ingest], *, exclusive: bool) -> Progress | None:
        """Update from one sample of every in-flight download; None when progress is unknown.

        `exclusive` says this is the only pull running on the node, so unknown layers are its own.
        """
        current: dict[str, Ingest] = {}
        for ingest in ingests:
            digest = layer_digest(ingest.ref)
            if digest is not None and self._wants(digest, exclusive):
                current[digest] = ingest
        for digest, ingest in current.items():
            self._offsets[digest] = max(self._offsets.get(digest, 0), ingest.offset)
            self._totals[digest] = max(ingest.total, self._totals.get(digest, 0))
            self._committed.discard(digest)
        for digest in self._offsets:
            if digest not in current:
                self._committed.add(digest)
        return self.progress()

    def progress(self) -> Progress | None:
        """Progress as of the last sample, without sampling."""
        if self._expected is None and not self._offsets:
            return None
        sizes = dict(self._totals)
        if self._expected is not None:
            sizes = {digest: self._expected[digest] or self._totals.get(digest, 0) for digest in self._expected}
        done = 0
        for digest, offset in self._offsets.items():
            size = sizes.get(digest, 0)
            done += size if digest in self._committed else min(offset, size) if size else offset
        total = sum(sizes.values()) if sizes else None
        if self._expected is None and total is not None:
            # Layers not seen yet are not in the sum: the total can only be a lower bound.
            total = max(total, done)
        return Progress(bytes_done=done, bytes_total=total)

    def finished(self) -> Progress | None:
        """Progress of a pull that succeeded: every layer is in the content store."""
        if self._expected is not None:
            total = sum(self._expected.values())
            return Progress(bytes_done=total, bytes_total=total)
        last = self.progress()
        if last is None:
            return None
        total = last.bytes_total if last.bytes_total is not None else last.bytes_done
        return Progress(bytes_done=total, bytes_total=total)
