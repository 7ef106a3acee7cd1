"""A worker's answer to a call, known byte for byte but for its per-call values.

A graph worker answers each call with one write: an acknowledgement frame for each of the
call's shared inputs, then the result frame, every one with the compact binary header and its
buffers in the worker's arena. Call after call of the same stage, those bytes differ only in
the values that change with the call: the acknowledged generations, the call id, epoch and
request id, the run time, the bytes copied, and each output's generation and arena offset.

:class:`AnswerLayout` is learned from one such write that the frame decoder has read and
checked in full. A later write of exactly that layout is read with one ``struct`` call: every
other byte must equal the learned write's (the kinds, flags, names, owners, dtypes, shapes,
arena names and lengths, all checked when it was learned), and the values are checked as the
full decoder checks them. Anything else is not an answer of this layout, and the caller reads
the write the usual way. Reading an answer this way touches a few objects instead of the
decoder's, the messages' and the descriptors' layers: a thread that has just woken up, its
caches cold, returns sooner.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from runtime.contracts import binary
from runtime.contracts.codec import PREFIX, PREFIX_SIZE
from runtime.contracts.messages import AckMessage

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from runtime.contracts.buffers import BufferDescriptor
    from runtime.contracts.codec import Frame
    from runtime.contracts.messages import ResultMessage

    from .arena import ArenaSlot
    from .channel import FramedChannel
    from .frame_io import PreparedFrame

__all__ = ["Answer", "AnswerLayout", "pack_run_s", "prepare_answer", "send_answer"]

#: The largest value a u64 field may carry (the contracts' 63-bit counters and offsets).
_MAX_U63: Final = 2**63 - 1
#: The most acknowledgement frames an answer layout covers.
MAX_ACKS: Final = 64
#: The most sets of output slots whose arrays a layout keeps (a worker uses one or two).
MAX_VIEWS: Final = 8


@dataclass(frozen=True, slots=True)
class Answer:
    """The per-call values of a write of a known layout, checked."""

    #: ``(owner, generation)`` of each acknowledgement, in order.
    acks: tuple[tuple[str, int], ...]
    call_id: int
    epoch: int
    run_s: float
    copied_bytes: int
    request_id: bytes
    #: Each output's generation and arena offset (in the result's order).
    generations: tuple[int, ...]
    offsets: tuple[int, ...]
    #: The learned outputs' descriptors (what :attr:`buffers` derives each one from).
    learned: tuple[BufferDescriptor, ...]

    @property
    def buffer_acks(self) -> list[tuple[str, int]]:
        """``(owner, generation)`` of each output, which its reader acknowledges."""
        return [(d.owner, g) for d, g in zip(self.learned, self.generations, strict=True)]

    @property
    def buffers(self) -> tuple[BufferDescriptor, ...]:
        """Each output's buffer: the learned one with this call's generation and offset."""
        return tuple(
            descriptor.with_generation(generation, offset)
            for descriptor, generation, offset in zip(
                self.learned, self.generations, self.offsets, strict=True
            )
        )


class AnswerLayout:
    """The layout of one answer write; build it with :meth:`learn`."""

    __slots__ = (
        "_ack_owners",
        "_ack_slots",
        "_call_id_at",
        "_copied_at",
        "_descriptors",
        "_epoch_at",
        "_generation_slots",
        "_match",
        "_offset_slots",
        "_pack_slots",
        "_pick_acks",
        "_pick_counters",
        "_pick_generations",
        "_pick_offsets",
        "_request_id_at",
        "_run_s_at",
        "_struct",
        "_template",
        "ack_owners",
        "buffer_specs",
        "output_names",
        "request_id_size",
        "run_s_at",
        "size",
        "views",
    )

    def __init__(
        self,
        formats: list[str],
        literal_index: list[int],
        literals: list[bytes],
        value_index: list[int],
        fields: list[tuple[str, int]],
        ack_owners: tuple[str, ...],
        descriptors: tuple[BufferDescriptor, ...],
        output_names: tuple[str, ...],
    ) -> None:
        self._struct = struct.Struct("<" + "".join(formats))
        self.size = self._struct.size
        self._ack_owners = ack_owners
        self._descriptors = descriptors
        self.output_names = output_names
        # Where each value lies in the values' tuple.
        at = {field: index for index, field in enumerate(fields)}
        self._call_id_at = at[("call_id", 0)]
        self._epoch_at = at[("epoch", 0)]
        self._run_s_at = at[("run_s", 0)]
        self._copied_at = at[("copied_bytes", 0)]
        self._request_id_at = at[("request_id", 0)]
        self._pick_acks = binary.picker([at[("ack", i)] for i in range(len(ack_owners))])
        self._pick_generations = binary.picker(
            [at[("generation", i)] for i in range(len(descriptors))]
        )
        self._pick_offsets = binary.picker([at[("offset", i)] for i in range(len(descriptors))])
        #: Every u64 value (all but the run time and the request id): at most 63 bits.
        self._pick_counters = binary.picker(
            [index for index, field in enumerate(fields) if field[0] not in ("run_s", "request_id")]
        )
        # For packing: the struct's arguments with every literal in place, and where each
        # value goes among them.
        template: list[object] = [None] * len(formats)
        for index, literal in zip(literal_index, literals, strict=True):
            template[index] = literal
        self._template = template
        #: Matching a write: its literal bytes at once, then its values.
        self._match = binary.LiteralMatch(formats, template)
        slots = {field: value_index[index] for index, field in enumerate(fields)}
        self._pack_slots = tuple(
            slots[(name, 0)] for name in ("call_id", "epoch", "run_s", "copied_bytes", "request_id")
        )
        self._ack_slots = tuple(slots[("ack", index)] for index in range(len(ack_owners)))
        self._generation_slots = tuple(
            slots[("generation", index)] for index in range(len(descriptors))
        )
        self._offset_slots = tuple(slots[("offset", index)] for index in range(len(descriptors)))
        #: What a call must have for its answer to take this layout (:meth:`pack`).
        self.ack_owners = ack_owners
        self.request_id_size = int(formats[value_index[self._request_id_at]][:-1])
        self.buffer_specs = tuple((d.dtype, d.shape) for d in descriptors)
        #: Where the run time lies in the write (:func:`pack_run_s`).
        self.run_s_at = struct.calcsize("<" + "".join(formats[: value_index[self._run_s_at]]))
        #: For the reader of these answers: the arrays over the outputs at each tuple of
        #: offsets seen (the same slots, call after call), made and checked once
        #: (:meth:`outputs`).
        self.views: dict[tuple[int, ...], dict[str, Any]] = {}

    @classmethod
    def learn(cls, data: bytes | memoryview, frames: list[Frame]) -> AnswerLayout | None:
        """The layout of ``data``, one whole write the decoder read as ``frames`` (already
        checked), when it is an answer: acknowledgements, then one result, binary headers,
        no inline bytes. None for any other write."""
        raw = bytes(data)
        if (
            not frames
            or frames[-1].kind != "result"
            or any(frame.kind != "ack" for frame in frames[:-1])
            or len(frames) - 1 > MAX_ACKS
        ):
            return None
        formats: list[str] = []
        literal_index: list[int] = []
        literals: list[bytes] = []
        value_index: list[int] = []
        fields: list[tuple[str, int]] = []
        position = 0
        ack_owners: list[str] = []
        for frame in frames:
            if len(raw) - position < PREFIX_SIZE:
                return None
            magic, header_len, payload_len = PREFIX.unpack_from(raw, position)
            header_start = position + PREFIX_SIZE
            end = header_start + header_len
            if magic != binary.MAGIC or payload_len or end > len(raw):
                return None
            try:
                decoded, spans = binary.header_spans(raw[header_start:end], _MAX_BUFFERS)
            except ValueError:
                return None
            kind, body, descriptors, _ = decoded
            if kind != frame.kind or descriptors != frame.buffers or dict(body) != frame.body:
                return None
            if kind == "ack":
                ack_owners.append(str(body["owner"]))
            # Literal bytes up to each value, then the value.
            for start, field in spans:
                at = header_start + start
                if at > position:
                    literal_index.append(len(formats))
                    literals.append(raw[position:at])
                    formats.append(f"{at - position}s")
                value_index.append(len(formats))
                if field == "request_id":
                    size = len(str(body["request_id"]).encode("utf-8"))
                    formats.append(f"{size}s")
                    fields.append(("request_id", 0))
                else:
                    size = 8
                    formats.append("d" if field == "run_s" else "Q")
                    if kind == "ack":
                        fields.append(("ack", len(ack_owners) - 1))
                    else:
                        fields.append(field if isinstance(field, tuple) else (field, 0))
                position = at + size
            if end > position:
                literal_index.append(len(formats))
                literals.append(raw[position:end])
                formats.append(f"{end - position}s")
            position = end
        if position != len(raw):
            return None
        result = frames[-1]
        if not result.buffers or not all(d.in_arena for d in result.buffers):
            return None
        return cls(
            formats,
            literal_index,
            literals,
            value_index,
            fields,
            tuple(ack_owners),
            result.buffers,
            tuple(result.body["output_names"]),
        )

    def match(self, data: bytes | memoryview) -> Answer | None:
        """The values of ``data`` when it is a whole write of this layout with valid values;
        None otherwise (the caller then reads it the usual way)."""
        values = self._match.values(data)
        if values is None:
            return None
        counters = self._pick_counters(values)
        run_s = values[self._run_s_at]
        if (counters and max(counters) > _MAX_U63) or not math.isfinite(run_s):
            return None
        return Answer(
            tuple(zip(self._ack_owners, self._pick_acks(values), strict=True)),
            values[self._call_id_at],
            values[self._epoch_at],
            run_s,
            values[self._copied_at],
            values[self._request_id_at],
            self._pick_generations(values),
            self._pick_offsets(values),
            self._descriptors,
        )

    def outputs(
        self, answer: Answer, read: Callable[[tuple[BufferDescriptor, ...]], dict[str, Any]]
    ) -> dict[str, Any]:
        """The arrays over ``answer``'s outputs: ``read(descriptors)`` makes them the first
        time these offsets come (and checks them), later answers in the same slots reuse them.
        A new dict each time; the arrays read the slots in place, as ``read``'s do."""
        offsets = answer.offsets
        arrays = self.views.get(offsets)
        if arrays is None:
            arrays = read(answer.buffers)
            if len(self.views) >= MAX_VIEWS:
                self.views.clear()
            self.views[offsets] = arrays
        return dict(arrays)

    def pack(
        self,
        acks: Sequence[int],
        call_id: int,
        epoch: int,
        run_s: float,
        copied_bytes: int,
        request_id: bytes,
        generations: Sequence[int],
        offsets: Sequence[int],
    ) -> bytes:
        """The bytes of an answer of this layout with these values: what encoding its frames
        gives, for a call whose acknowledgements' owners are :attr:`ack_owners`, whose request
        id is :attr:`request_id_size` bytes and whose outputs are :attr:`buffer_specs` (dtype
        and shape) in the learned arena; the values must be what the frames accept (63-bit
        counters, a finite time). Raises ``ValueError`` when they are not."""
        if (
            len(acks) != len(self.ack_owners)
            or len(request_id) != self.request_id_size
            or len(generations) != len(self._descriptors)
            or len(offsets) != len(self._descriptors)
            or not math.isfinite(run_s)
        ):
            raise ValueError("the values do not fit this answer layout")
        counters = (*acks, call_id, epoch, copied_bytes, *generations, *offsets)
        if min(counters) < 0 or max(counters) > _MAX_U63:
            raise ValueError("a counter of this answer is outside 0 to 2**63 - 1")
        args = list(self._template)
        values = (call_id, epoch, run_s, copied_bytes, request_id)
        for slot, value in zip(self._pack_slots, values, strict=True):
            args[slot] = value
        for slot, generation in zip(self._ack_slots, acks, strict=True):
            args[slot] = generation
        for slot, generation in zip(self._generation_slots, generations, strict=True):
            args[slot] = generation
        for slot, offset in zip(self._offset_slots, offsets, strict=True):
            args[slot] = offset
        return self._struct.pack(*args)


_RUN_S: Final = struct.Struct("<d")


def pack_run_s(data: bytearray, at: int, run_s: float) -> None:
    """Write ``run_s`` into an answer packed with a zero run time, at its layout's
    :attr:`AnswerLayout.run_s_at`. Raises ``ValueError`` for a time that is not a finite
    number of seconds >= 0 (the frames cannot carry it)."""
    if not math.isfinite(run_s) or run_s < 0:
        raise ValueError(f"run time {run_s!r}; accepted: a finite number of seconds >= 0")
    _RUN_S.pack_into(data, at, run_s)


def prepare_answer(
    channel: FramedChannel,
    message: ResultMessage,
    arrays: Mapping[str, Any],
    *,
    owner: str,
    generation: int,
    placed: Mapping[str, ArenaSlot],
    acks: Iterable[tuple[str, int]] = (),
) -> PreparedFrame | None:
    """A worker's answer (the acknowledgements, then the result) encoded before its run ends,
    to be sent by :func:`send_answer` with the run's time, or withdrawn if the run fails: what
    the worker does once the run ends is then one write. Only outputs already in their arena
    slots (``placed``) are prepared this way (the run writes their bytes); None where the
    channel does not send binary headers (the time cannot be filled in then)."""
    if not channel.binary_headers or set(placed) != set(arrays):
        return None
    if tuple(arrays) != message.buffer_names:
        raise ValueError(
            f"{message.KIND} names tensors {list(message.buffer_names)} "
            f"but arrays {list(arrays)} were given"
        )
    prepared = channel.prepare(
        message.KIND,
        message.to_body(),
        arrays,
        owner,
        generation,
        (),
        placed,
        [AckMessage(ack_owner, ack) for ack_owner, ack in acks],
        (),
        None,
    )
    if binary.with_run_s(prepared.chunks[prepared.header_index], 0.0) is None:
        prepared.withdraw()
        return None
    return prepared


def send_answer(channel: FramedChannel, prepared: PreparedFrame, *, run_s: float) -> None:
    """Send an answer made by :func:`prepare_answer` with ``run_s`` as its run time; its
    buffers are withdrawn if that fails."""
    header = binary.with_run_s(prepared.chunks[prepared.header_index], run_s)
    if header is None:
        prepared.withdraw()
        raise ValueError(f"run time {run_s!r}; accepted: a finite number of seconds >= 0")
    prepared.chunks[prepared.header_index] = header
    channel.write_prepared(prepared)


#: The buffer limit a layout is learned under (an answer has one buffer per output).
_MAX_BUFFERS: Final = 256
