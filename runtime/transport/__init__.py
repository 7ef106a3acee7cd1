"""Worker transport: framed stdio channels and shared-memory buffers with acknowledgements."""

from runtime.wire import descriptor_dtype, numpy_dtype

from .channel import (
    DEFAULT_SHM_THRESHOLD,
    ChannelClosed,
    ChannelTimeout,
    FramedChannel,
    ProtocolError,
    frame_acks,
)
from .handshake import HandshakeError, expect_hello, send_hello
from .shm import (
    DEFAULT_MAX_BUFFERS,
    DEFAULT_MAX_BYTES,
    ShmConsumer,
    ShmError,
    ShmLimitExceeded,
    ShmProducer,
    ShmSegment,
    new_prefix,
    process_retained,
    shm_supported,
    sweep_segments,
)
from .stdio import claim_worker_stdio, start_log_pump, start_reader_thread

__all__ = [
    "DEFAULT_MAX_BUFFERS",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_SHM_THRESHOLD",
    "ChannelClosed",
    "ChannelTimeout",
    "FramedChannel",
    "HandshakeError",
    "ProtocolError",
    "ShmConsumer",
    "ShmError",
    "ShmLimitExceeded",
    "ShmProducer",
    "ShmSegment",
    "claim_worker_stdio",
    "descriptor_dtype",
    "expect_hello",
    "frame_acks",
    "new_prefix",
    "numpy_dtype",
    "process_retained",
    "send_hello",
    "shm_supported",
    "start_log_pump",
    "start_reader_thread",
    "sweep_segments",
]
