"""The agent's record of the images it pulled: what it may ever remove, and Prewarm's footprint on the node.

One entry per image (its id, the config digest the CRI reports): the names the agent pulled it by (the
task's reference and the repo digest the pull reported), its size, when it was pulled, and, once a
`ReleaseImage` said so, when it is due for removal. A pull that found the image already there adds
nothing: Prewarm did not put it there. The record is a JSON file in the agent's state directory
(`STATE_DIR`, a hostPath: /var/lib/prewarm on the node), written whole and renamed into place, so it
survives the agent's restarts and never holds half a write. Without a state directory it lives in memory
only, and an agent restarted forgets what it pulled before (it then removes none of it).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RECORD_FILE = "pulled-images.json"
_VERSION = 1


@dataclass(frozen=True)
class PulledImage:
    """One image the agent pulled."""

    image_id: str
    names: tuple[str, ...]
    bytes: int
    pulled_at: float
    remove_at: float | None = None


@dataclass(frozen=True)
class RecordTotals:
    """What the record says the node holds of Prewarm's, and what its removals freed, all told."""

    images: int
    bytes: int
    freed_bytes: int


@dataclass
class _State:
    images: dict[str, PulledImage] = field(default_factory=dict)
    freed_bytes: int = 0


class PullRecord:
    """The record, safe to share between the pull threads, the consumer and the removal loop."""

    def __init__(self, state_dir: str | Path | None) -> None:
        self.path = Path(state_dir) / RECORD_FILE if state_dir else None
        self._lock = threading.Lock()
        self._state = self._load()

    def _load(self) -> _State:
        if self.path is None or not self.path.exists():
            return _State()
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            images = {i["image_id"]: PulledImage(i["image_id"], tuple(i["names"]), int(i["bytes"]),
                                                 float(i["pulled_at"]), i.get("remove_at"))
                      for i in data["images"]}
            return _State(images, int(data.get("freed_bytes", 0)))
        except (OSError, ValueError, KeyError, TypeError) as e:
            # Unreadable: start afresh rather than guess; what it listed is never removed (not known as ours).
            log.warning("record of pulled images %s unreadable, starting a new one: %s", self.path, e)
            return _State()

    def _save(self) -> None:
        if self.path is None:
            return
        data: dict[str, Any] = {"v": _VERSION, "freed_bytes": self._state.freed_bytes,
                                "images": [asdict(i) for i in self._state.images.values()]}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(".tmp")
            partial.write_text(json.dumps(data, sort_keys=True), encoding="utf-8")
            os.replace(partial, self.path)
        except OSError as e:
            log.warning("record of pulled images not saved to %s (kept in memory): %s", self.path, e)

    def pulled(self, image_id: str, names: tuple[str, ...], size: int, at: float) -> None:
        """The agent pulled the image `image_id` by `names` (wanted from now on: no removal due)."""
        with self._lock:
            known = self._state.images.get(image_id)
            merged = tuple(sorted({*(known.names if known else ()), *names}))
            self._state.images[image_id] = PulledImage(image_id, merged, size, known.pulled_at if known else at)
            self._save()

    def wanted(self, names: tuple[str, ...]) -> bool:
        """A task wants an image already there by one of `names`: a removal due for it is called off.
        Returns whether the image is one the agent pulled."""
        with self._lock:
            entry = self._find(names)
            if entry is None:
                return False
            if entry.remove_at is not None:
                self._state.images[entry.image_id] = replace(entry, remove_at=None)
                self._save()
            return True

    def release(self, name: str, remove_at: float) -> PulledImage | None:
        """The image the agent pulled by `name` is due for removal at `remove_at` (the earliest such time
        stands); None when the agent did not pull it (it stays)."""
        with self._lock:
            entry = self._find((name,))
            if entry is None:
                return None
            due = remove_at if entry.remove_at is None else min(entry.remove_at, remove_at)
            self._state.images[entry.image_id] = updated = replace(entry, remove_at=due)
            self._save()
            return updated

    def due(self, now: float) -> list[PulledImage]:
        with self._lock:
            return [i for i in self._state.images.values() if i.remove_at is not None and i.remove_at <= now]

    def images(self) -> list[PulledImage]:
        with self._lock:
            return list(self._state.images.values())

    def forget(self, image_ids: list[str], *, freed: int = 0) -> None:
        """Drops images no longer there (or no longer Prewarm's alone), adding `freed` to the bytes freed."""
        with self._lock:
            dropped = [self._state.images.pop(image_id, None) for image_id in image_ids]
            self._state.freed_bytes += freed
            if freed or any(dropped):  # the removal loop calls this every pass: no rewrite when nothing went
                self._save()

    def totals(self) -> RecordTotals:
        with self._lock:
            images = self._state.images.values()
            return RecordTotals(len(images), sum(i.bytes for i in images), self._state.freed_bytes)

    def _find(self, names: tuple[str, ...]) -> PulledImage | None:
        return next((i for i in self._state.images.values() if set(names) & set(i.names)), None)
