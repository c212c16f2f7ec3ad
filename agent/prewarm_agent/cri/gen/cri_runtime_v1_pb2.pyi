# mypy: ignore-errors
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ContainerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTAINER_CREATED: _ClassVar[ContainerState]
    CONTAINER_RUNNING: _ClassVar[ContainerState]
    CONTAINER_EXITED: _ClassVar[ContainerState]
    CONTAINER_UNKNOWN: _ClassVar[ContainerState]
CONTAINER_CREATED: ContainerState
CONTAINER_RUNNING: ContainerState
CONTAINER_EXITED: ContainerState
CONTAINER_UNKNOWN: ContainerState

class VersionRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: str
    def __init__(self, version: _Optional[str] = ...) -> None: ...

class VersionResponse(_message.Message):
    __slots__ = ("version", "runtime_name", "runtime_version", "runtime_api_version")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_NAME_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_API_VERSION_FIELD_NUMBER: _ClassVar[int]
    version: str
    runtime_name: str
    runtime_version: str
    runtime_api_version: str
    def __init__(self, version: _Optional[str] = ..., runtime_name: _Optional[str] = ..., runtime_version: _Optional[str] = ..., runtime_api_version: _Optional[str] = ...) -> None: ...

class Int64Value(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: int
    def __init__(self, value: _Optional[int] = ...) -> None: ...

class UInt64Value(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: int
    def __init__(self, value: _Optional[int] = ...) -> None: ...

class PodSandboxMetadata(_message.Message):
    __slots__ = ("name", "uid", "namespace", "attempt")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    name: str
    uid: str
    namespace: str
    attempt: int
    def __init__(self, name: _Optional[str] = ..., uid: _Optional[str] = ..., namespace: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class PodSandboxConfig(_message.Message):
    __slots__ = ("metadata", "hostname", "log_directory", "labels", "annotations")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    LOG_DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    metadata: PodSandboxMetadata
    hostname: str
    log_directory: str
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    def __init__(self, metadata: _Optional[_Union[PodSandboxMetadata, _Mapping]] = ..., hostname: _Optional[str] = ..., log_directory: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ImageSpec(_message.Message):
    __slots__ = ("image", "annotations", "user_specified_image", "runtime_handler", "image_ref")
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    USER_SPECIFIED_IMAGE_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_HANDLER_FIELD_NUMBER: _ClassVar[int]
    IMAGE_REF_FIELD_NUMBER: _ClassVar[int]
    image: str
    annotations: _containers.ScalarMap[str, str]
    user_specified_image: str
    runtime_handler: str
    image_ref: str
    def __init__(self, image: _Optional[str] = ..., annotations: _Optional[_Mapping[str, str]] = ..., user_specified_image: _Optional[str] = ..., runtime_handler: _Optional[str] = ..., image_ref: _Optional[str] = ...) -> None: ...

class AuthConfig(_message.Message):
    __slots__ = ("username", "password", "auth", "server_address", "identity_token", "registry_token")
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    AUTH_FIELD_NUMBER: _ClassVar[int]
    SERVER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    username: str
    password: str
    auth: str
    server_address: str
    identity_token: str
    registry_token: str
    def __init__(self, username: _Optional[str] = ..., password: _Optional[str] = ..., auth: _Optional[str] = ..., server_address: _Optional[str] = ..., identity_token: _Optional[str] = ..., registry_token: _Optional[str] = ...) -> None: ...

class Image(_message.Message):
    __slots__ = ("id", "repo_tags", "repo_digests", "size", "uid", "username", "spec", "pinned")
    ID_FIELD_NUMBER: _ClassVar[int]
    REPO_TAGS_FIELD_NUMBER: _ClassVar[int]
    REPO_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    id: str
    repo_tags: _containers.RepeatedScalarFieldContainer[str]
    repo_digests: _containers.RepeatedScalarFieldContainer[str]
    size: int
    uid: Int64Value
    username: str
    spec: ImageSpec
    pinned: bool
    def __init__(self, id: _Optional[str] = ..., repo_tags: _Optional[_Iterable[str]] = ..., repo_digests: _Optional[_Iterable[str]] = ..., size: _Optional[int] = ..., uid: _Optional[_Union[Int64Value, _Mapping]] = ..., username: _Optional[str] = ..., spec: _Optional[_Union[ImageSpec, _Mapping]] = ..., pinned: _Optional[bool] = ...) -> None: ...

class ImageFilter(_message.Message):
    __slots__ = ("image",)
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    image: ImageSpec
    def __init__(self, image: _Optional[_Union[ImageSpec, _Mapping]] = ...) -> None: ...

class ListImagesRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: ImageFilter
    def __init__(self, filter: _Optional[_Union[ImageFilter, _Mapping]] = ...) -> None: ...

class ListImagesResponse(_message.Message):
    __slots__ = ("images",)
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    images: _containers.RepeatedCompositeFieldContainer[Image]
    def __init__(self, images: _Optional[_Iterable[_Union[Image, _Mapping]]] = ...) -> None: ...

class ImageStatusRequest(_message.Message):
    __slots__ = ("image", "verbose")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    VERBOSE_FIELD_NUMBER: _ClassVar[int]
    image: ImageSpec
    verbose: bool
    def __init__(self, image: _Optional[_Union[ImageSpec, _Mapping]] = ..., verbose: _Optional[bool] = ...) -> None: ...

class ImageStatusResponse(_message.Message):
    __slots__ = ("image", "info")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    image: Image
    info: _containers.ScalarMap[str, str]
    def __init__(self, image: _Optional[_Union[Image, _Mapping]] = ..., info: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PullImageRequest(_message.Message):
    __slots__ = ("image", "auth", "sandbox_config")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    AUTH_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_CONFIG_FIELD_NUMBER: _ClassVar[int]
    image: ImageSpec
    auth: AuthConfig
    sandbox_config: PodSandboxConfig
    def __init__(self, image: _Optional[_Union[ImageSpec, _Mapping]] = ..., auth: _Optional[_Union[AuthConfig, _Mapping]] = ..., sandbox_config: _Optional[_Union[PodSandboxConfig, _Mapping]] = ...) -> None: ...

class PullImageResponse(_message.Message):
    __slots__ = ("image_ref",)
    IMAGE_REF_FIELD_NUMBER: _ClassVar[int]
    image_ref: str
    def __init__(self, image_ref: _Optional[str] = ...) -> None: ...

class RemoveImageRequest(_message.Message):
    __slots__ = ("image",)
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    image: ImageSpec
    def __init__(self, image: _Optional[_Union[ImageSpec, _Mapping]] = ...) -> None: ...

class RemoveImageResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ImageFsInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FilesystemIdentifier(_message.Message):
    __slots__ = ("mountpoint",)
    MOUNTPOINT_FIELD_NUMBER: _ClassVar[int]
    mountpoint: str
    def __init__(self, mountpoint: _Optional[str] = ...) -> None: ...

class FilesystemUsage(_message.Message):
    __slots__ = ("timestamp", "fs_id", "used_bytes", "inodes_used")
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    FS_ID_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    INODES_USED_FIELD_NUMBER: _ClassVar[int]
    timestamp: int
    fs_id: FilesystemIdentifier
    used_bytes: UInt64Value
    inodes_used: UInt64Value
    def __init__(self, timestamp: _Optional[int] = ..., fs_id: _Optional[_Union[FilesystemIdentifier, _Mapping]] = ..., used_bytes: _Optional[_Union[UInt64Value, _Mapping]] = ..., inodes_used: _Optional[_Union[UInt64Value, _Mapping]] = ...) -> None: ...

class ImageFsInfoResponse(_message.Message):
    __slots__ = ("image_filesystems", "container_filesystems")
    IMAGE_FILESYSTEMS_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FILESYSTEMS_FIELD_NUMBER: _ClassVar[int]
    image_filesystems: _containers.RepeatedCompositeFieldContainer[FilesystemUsage]
    container_filesystems: _containers.RepeatedCompositeFieldContainer[FilesystemUsage]
    def __init__(self, image_filesystems: _Optional[_Iterable[_Union[FilesystemUsage, _Mapping]]] = ..., container_filesystems: _Optional[_Iterable[_Union[FilesystemUsage, _Mapping]]] = ...) -> None: ...

class ContainerMetadata(_message.Message):
    __slots__ = ("name", "attempt")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    name: str
    attempt: int
    def __init__(self, name: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class ContainerFilter(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ListContainersRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: ContainerFilter
    def __init__(self, filter: _Optional[_Union[ContainerFilter, _Mapping]] = ...) -> None: ...

class Container(_message.Message):
    __slots__ = ("id", "pod_sandbox_id", "metadata", "image", "image_ref", "state")
    ID_FIELD_NUMBER: _ClassVar[int]
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_REF_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    id: str
    pod_sandbox_id: str
    metadata: ContainerMetadata
    image: ImageSpec
    image_ref: str
    state: ContainerState
    def __init__(self, id: _Optional[str] = ..., pod_sandbox_id: _Optional[str] = ..., metadata: _Optional[_Union[ContainerMetadata, _Mapping]] = ..., image: _Optional[_Union[ImageSpec, _Mapping]] = ..., image_ref: _Optional[str] = ..., state: _Optional[_Union[ContainerState, str]] = ...) -> None: ...

class ListContainersResponse(_message.Message):
    __slots__ = ("containers",)
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    containers: _containers.RepeatedCompositeFieldContainer[Container]
    def __init__(self, containers: _Optional[_Iterable[_Union[Container, _Mapping]]] = ...) -> None: ...
