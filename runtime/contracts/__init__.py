"""Stage contracts: every type that crosses a process boundary.

This package imports only the Python standard library, so any implementation (a
worker in another interpreter, a native controller) can depend on it alone.
"""

from .buffers import MAX_BUFFER_BYTES, BufferDescriptor, DescriptorError, DType
from .codec import (
    ERROR_CODES,
    Frame,
    FrameDecoder,
    FrameError,
    FrameLimits,
    decode_frame,
    encode_frame,
    encode_frame_parts,
)
from .devices import (
    MACHINE_RAM,
    VRAM_PREFIX,
    WSL_QUOTA,
    DeviceDescriptor,
    DeviceKind,
    ExecutionDomain,
    Integration,
    is_constraint_name,
    vram_constraint,
)
from .ids import EventId, RequestKey, new_request_id
from .manifest import (
    MANIFEST_NAME,
    REQUIRED_METADATA,
    ArtifactManifest,
    ManifestError,
    check_relative_path,
)
from .state import StateHandle
from .versions import (
    KNOWN_FEATURES,
    PROTOCOL_VERSION,
    FeatureError,
    Negotiated,
    check_required,
    negotiate,
)

__all__ = [
    "ERROR_CODES",
    "KNOWN_FEATURES",
    "MACHINE_RAM",
    "MANIFEST_NAME",
    "MAX_BUFFER_BYTES",
    "PROTOCOL_VERSION",
    "REQUIRED_METADATA",
    "VRAM_PREFIX",
    "WSL_QUOTA",
    "ArtifactManifest",
    "BufferDescriptor",
    "DType",
    "DescriptorError",
    "DeviceDescriptor",
    "DeviceKind",
    "EventId",
    "ExecutionDomain",
    "FeatureError",
    "Frame",
    "FrameDecoder",
    "FrameError",
    "FrameLimits",
    "Integration",
    "ManifestError",
    "Negotiated",
    "RequestKey",
    "StateHandle",
    "check_relative_path",
    "check_required",
    "decode_frame",
    "encode_frame",
    "encode_frame_parts",
    "is_constraint_name",
    "negotiate",
    "new_request_id",
    "vram_constraint",
]
