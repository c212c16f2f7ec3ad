"""Pinning an image in containerd, so kubelet's image garbage collection keeps it.

The CRI reports an image as `pinned` when its containerd image record carries the label
`io.cri-containerd.pinned=pinned`, and kubelet's garbage collection skips pinned images (kubelet
1.29, and the 1.25-1.28 patch releases with kubernetes#119986). containerd honours a label set on an
image it already holds from 1.7.10 (containerd#9381); 1.6 stores the label but its CRI does not
report the image pinned. The CRI has no call for labels, so this uses containerd's own images API.

One CRI pull makes several records of one image (its tag, `repo@digest`, and the config digest
`sha256:...`), all with the same target: each is labelled, since the CRI may look at any of them.
"""

from __future__ import annotations

import grpc
from google.protobuf.field_mask_pb2 import FieldMask

from prewarm_agent.cri.client import CRI_NAMESPACE, DEFAULT_TIMEOUT, _call_error, _SocketClient
from prewarm_agent.cri.errors import CriError
from prewarm_agent.cri.gen import containerd_images_v1_pb2 as images_pb2
from prewarm_agent.cri.gen import containerd_images_v1_pb2_grpc as images_grpc

PINNED_LABEL = "io.cri-containerd.pinned"
PINNED_VALUE = "pinned"


class ImageNotFoundError(CriError):
    """No image record has the name to pin."""


class ImagePins(_SocketClient):
    """Labels on containerd's image records (namespace `k8s.io`, the CRI's) over its images API."""

    def __init__(self, socket_path: str, namespace: str = CRI_NAMESPACE, timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(socket_path, timeout)
        self._images = images_grpc.ImagesStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = (("containerd-namespace", namespace),)

    def _list(self) -> list[images_pb2.Image]:
        try:
            response = self._images.List(images_pb2.ListImagesRequest(), timeout=self.timeout,
                                         metadata=self._metadata)
        except grpc.RpcError as err:
            raise _call_error(err, socket_path=self.socket_path, action="listing image records",
                              timeout=self.timeout) from err
        return list(response.images)

    def records(self, reference: str) -> list[images_pb2.Image]:
        """Every record of the image named `reference` (a name containerd stored it under), or []."""
        everything = self._list()
        named = next((image for image in everything if image.name == reference), None)
        if named is None:
            return []
        return [image for image in everything if image.target.digest == named.target.digest]

    def labels(self, name: str) -> dict[str, str] | None:
        """The labels of the record `name`, or None when there is none."""
        found = next((image for image in self._list() if image.name == name), None)
        return None if found is None else dict(found.labels)

    def pin(self, reference: str) -> list[str]:
        """Labels every record of the image pinned; returns their names. Other labels are left alone."""
        return self._label(reference, PINNED_VALUE, "pin")

    def unpin(self, reference: str) -> list[str]:
        """Takes the label off every record of the image; returns their names."""
        return self._label(reference, None, "unpin")

    def _label(self, reference: str, value: str | None, action: str) -> list[str]:
        records = self.records(reference)
        if not records:
            raise ImageNotFoundError(f"cannot {action} {reference}: containerd holds no image by that name")
        # Only this one label: a field mask path into the labels map.
        mask = FieldMask(paths=[f"labels.{PINNED_LABEL}"])
        for record in records:
            # The target goes along although the mask leaves it alone: containerd 2.x dereferences it
            # before applying the mask, and crashes (the whole daemon) on an Update without one.
            image = images_pb2.Image(name=record.name, target=record.target,
                                     labels={PINNED_LABEL: value} if value is not None else {})
            try:
                self._images.Update(images_pb2.UpdateImageRequest(image=image, update_mask=mask),
                                    timeout=self.timeout, metadata=self._metadata)
            except grpc.RpcError as err:
                raise _call_error(err, socket_path=self.socket_path, action=f"labelling image record {record.name}",
                                  timeout=self.timeout) from err
        return sorted(record.name for record in records)
