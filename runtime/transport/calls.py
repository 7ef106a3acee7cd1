"""A call frame known byte for byte but for its per-call values: the caller's side of
:mod:`runtime.transport.answers`.

A direct caller sends a graph stage the same call again and again: the same input names,
dtypes and shapes, every input copied into the caller's arena, a compact binary header. Those
frames differ only in the call id, the epoch, the request id (of one length) and each input's
generation and arena offset. :class:`CallLayout` is learned from one frame the encoder made;
a later call with the same inputs is then written as :meth:`CallLayout.pack` gives it, one
``struct`` call, instead of building its message, descriptors and header again. The bytes are
the encoder's, so a worker reads them as any other call; a worker that learned the layout too
reads such a call with :meth:`CallLayout.match` (a masked compare and one unpack) instead of
the decoder and the messages.

:func:`send_call` copies the inputs into the arena and writes the packed frame; anything it
does not cover (another shape, an input kept across calls, no room in the arena) is left to
the usual way.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from runtime.contracts import binary
from runtime.contracts.codec import PREFIX, PREFIX_SIZE
from runtime.wire import numpy_dtype

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from runtime.contracts.buffers import BufferDescriptor

    from .arena import ArenaSlot
    from .channel import FramedChannel

__all__ = ["Call", "CallLayout", "CallPacker", "send_call"]

#: The largest value a u64 field may carry (the contracts' 63-bit counters and offsets).
_MAX_U63: Final = 2**63 - 1
#: The most inputs a call layout covers.
MAX_INPUTS: Final = 64
#: The largest frame a layout is learned from (a call whose inputs all lie in the arena has a
#: header of a few hundred bytes; a larger frame carries inline bytes).
_MAX_LEARNED: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class Call:
    """The per-call values of a call frame of a known layout, checked."""

    call_id: int
    epoch: int
    request_id: str
    generations: tuple[int, ...]
    offsets: tuple[int, ...]
    layout: CallLayout

    @property
    def buffers(self) -> tuple[BufferDescriptor, ...]:
        """Each input's buffer: the learned one with this call's generation and offset."""
        return tuple(
            descriptor.with_generation(generation, offset)
            for descriptor, generation, offset in zip(
                self.layout.descriptors, self.generations, self.offsets, strict=True
            )
        )

    @property
    def acks(self) -> list[tuple[str, int]]:
        """``(owner, generation)`` of each input, which its reader acknowledges."""
        owner = self.layout.owner
        return [(owner, generation) for generation in self.generations]


class CallLayout:
    """The layout of one call frame; build it with :meth:`learn`."""

    __slots__ = (
        "_generation_slots",
        "_match",
        "_offset_slots",
        "_pick_generations",
        "_pick_offsets",
        "_slot_call_id",
        "_slot_epoch",
        "_slot_request_id",
        "_struct",
        "_template",
        "_value_call_id",
        "_value_epoch",
        "_value_request_id",
        "descriptors",
        "input_names",
        "input_specs",
        "owner",
        "request_id_size",
        "size",
    )

    def __init__(
        self,
        formats: list[str],
        template: list[object],
        fields: dict[tuple[str, int], int],
        descriptors: tuple[BufferDescriptor, ...],
        input_names: tuple[str, ...],
    ) -> None:
        self._struct = struct.Struct("<" + "".join(formats))
        self.size = self._struct.size
        self._template = template
        #: Matching a frame (the worker's side): its literal bytes at once, then its values.
        self._match = binary.LiteralMatch(formats, template)
        # Where each value lies among the unpacked values (in the frame's order).
        order = sorted(fields, key=fields.__getitem__)
        at = {field: index for index, field in enumerate(order)}
        self._value_call_id = at[("call_id", 0)]
        self._value_epoch = at[("epoch", 0)]
        self._value_request_id = at[("request_id", 0)]
        count = len(input_names)
        self._pick_generations = binary.picker([at[("generation", i)] for i in range(count)])
        self._pick_offsets = binary.picker([at[("offset", i)] for i in range(count)])
        self._slot_call_id = fields[("call_id", 0)]
        self._slot_epoch = fields[("epoch", 0)]
        self._slot_request_id = fields[("request_id", 0)]
        self._generation_slots = tuple(fields[("generation", i)] for i in range(count))
        self._offset_slots = tuple(fields[("offset", i)] for i in range(count))
        #: The learned inputs' descriptors (a call's are these with its generations and
        #: offsets, :meth:`Call.buffers`).
        self.descriptors = descriptors
        #: The arena's owner (every input's descriptor names it).
        self.owner = descriptors[0].owner
        self.input_names = input_names
        #: Each input's NumPy dtype and shape, in order: what a call must send to fit.
        self.input_specs = tuple((numpy_dtype(d.dtype), d.shape) for d in descriptors)
        self.request_id_size = int(formats[self._slot_request_id][:-1])

    @classmethod
    def learn(cls, data: bytes | memoryview) -> CallLayout | None:
        """The layout of ``data``, one whole call frame as the encoder writes it: a binary
        header, every input in one arena, no inline bytes. None for any other frame."""
        raw = bytes(data)
        if len(raw) < PREFIX_SIZE:
            return None
        magic, header_len, payload_len = PREFIX.unpack_from(raw, 0)
        if magic != binary.MAGIC or payload_len or PREFIX_SIZE + header_len != len(raw):
            return None
        try:
            decoded, spans = binary.header_spans(raw[PREFIX_SIZE:], MAX_INPUTS)
        except ValueError:
            return None
        kind, body, descriptors, _ = decoded
        if (
            kind != "call"
            or not descriptors
            or not all(d.in_arena for d in descriptors)
            or len({d.owner for d in descriptors}) != 1
        ):
            return None
        formats: list[str] = []
        template: list[object] = []
        fields: dict[tuple[str, int], int] = {}
        position = 0
        for start, field in spans:
            at = PREFIX_SIZE + start
            if at > position:
                formats.append(f"{at - position}s")
                template.append(raw[position:at])
            name = field if isinstance(field, tuple) else (field, 0)
            fields[name] = len(formats)
            if field == "request_id":
                size = len(str(body["request_id"]).encode("utf-8"))
                formats.append(f"{size}s")
            else:
                size = 8
                formats.append("Q")
            template.append(None)
            position = at + size
        if len(raw) > position:
            formats.append(f"{len(raw) - position}s")
            template.append(raw[position:])
        return cls(formats, template, fields, tuple(descriptors), tuple(body["input_names"]))

    def match(self, data: bytes | memoryview) -> Call | None:
        """The values of ``data`` when it is one whole call frame of this layout with values
        the decoder accepts (63-bit counters, a UTF-8 request id); None otherwise (the reader
        then decodes it the usual way)."""
        values = self._match.values(data)
        if values is None:
            return None
        request_id = values[self._value_request_id]
        try:
            text = request_id.decode("utf-8")
        except UnicodeDecodeError:
            return None
        counters = [value for value in values if type(value) is int]
        if max(counters) > _MAX_U63:
            return None
        return Call(
            values[self._value_call_id],
            values[self._value_epoch],
            text,
            self._pick_generations(values),
            self._pick_offsets(values),
            self,
        )

    def fits(self, inputs: Mapping[str, Any]) -> bool:
        """Whether ``inputs`` travel as this layout's: the same names in order, each a
        C-ordered array of the learned dtype and shape (what the encoder sends as it is)."""
        if tuple(inputs) != self.input_names:
            return False
        for array, (dtype, shape) in zip(inputs.values(), self.input_specs, strict=True):
            if (
                type(array) is not np.ndarray
                or array.shape != shape
                or array.dtype != dtype
                or not array.flags.c_contiguous
            ):
                return False
        return True

    def pack(
        self,
        call_id: int,
        epoch: int,
        request_id: bytes,
        generations: Sequence[int],
        offsets: Sequence[int],
    ) -> bytes:
        """The bytes of a call of this layout with these values: what encoding its frame
        gives. Raises ``ValueError`` for values the frame cannot carry (a counter past 63
        bits, a request id of another length, another number of inputs)."""
        if (
            len(request_id) != self.request_id_size
            or len(generations) != len(self._generation_slots)
            or len(offsets) != len(self._offset_slots)
        ):
            raise ValueError("the values do not fit this call layout")
        counters = (call_id, epoch, *generations, *offsets)
        if min(counters) < 0 or max(counters) > _MAX_U63:
            raise ValueError("a counter of this call is outside 0 to 2**63 - 1")
        args = list(self._template)
        args[self._slot_call_id] = call_id
        args[self._slot_epoch] = epoch
        args[self._slot_request_id] = request_id
        for slot, generation in zip(self._generation_slots, generations, strict=True):
            args[slot] = generation
        for slot, offset in zip(self._offset_slots, offsets, strict=True):
            args[slot] = offset
        return self._struct.pack(*args)


def send_call(
    channel: FramedChannel,
    layout: CallLayout,
    inputs: Mapping[str, np.ndarray[Any, Any]],
    *,
    call_id: int,
    epoch: int,
    request_id: str,
    slots: dict[str, ArenaSlot],
) -> int | None:
    """Copy ``inputs`` (which :meth:`CallLayout.fits`) into the arena and write their call
    frame packed by ``layout``; the bytes copied, or None when the arena has no room for them
    or the values do not fit the layout (nothing written, nothing held: the caller sends the
    usual way). ``slots`` receives each input's slot. Raises what writing raises, with the
    slots freed."""
    arena = channel.arena(layout.owner)
    try:
        request = request_id.encode("utf-8")
    except UnicodeEncodeError:
        return None
    if (
        arena is None
        or arena.name != layout.descriptors[0].location
        or len(request) != layout.request_id_size
    ):
        return None
    taken: list[ArenaSlot] = []
    try:
        for array in inputs.values():
            slot = arena.put(array)
            if slot is None:
                break
            taken.append(slot)
        data = None
        if len(taken) == len(inputs):
            try:
                data = layout.pack(
                    call_id,
                    epoch,
                    request,
                    [slot.generation for slot in taken],
                    [slot.offset for slot in taken],
                )
            except ValueError:
                data = None
        if data is None:
            for held in taken:
                arena.acknowledge(held.generation)
            return None
        channel.write_frames(data)
    except BaseException:
        for held in taken:
            arena.acknowledge(held.generation)
        raise
    slots.update(zip(inputs, taken, strict=True))
    return sum(slot.nbytes for slot in taken)


class CallPacker:
    """One stage's packed calls: the layout it learned and when it learns one.

    A call whose inputs fit the layout is sent by :meth:`send`. Any other is sent the usual
    way; when its inputs have the same names, dtypes and shapes as the call before it (a
    caller repeating a call, not one whose shapes change every time), the frame it made
    teaches a new layout (:meth:`learn`)."""

    __slots__ = ("_signature", "layout", "packed")

    def __init__(self) -> None:
        self.layout: CallLayout | None = None
        self._signature: tuple[object, ...] | None = None
        #: Calls sent packed by a layout.
        self.packed = 0

    def fits(self, inputs: Mapping[str, Any]) -> bool:
        layout = self.layout
        return layout is not None and layout.fits(inputs)

    def repeated(self, inputs: Mapping[str, Any]) -> bool:
        """Whether ``inputs`` look like the last call's sent the usual way (then its frame
        is worth learning); remembers them for the next call."""
        signature = tuple(
            (name, getattr(value, "dtype", None), getattr(value, "shape", None))
            for name, value in inputs.items()
        )
        repeated = signature == self._signature
        self._signature = signature
        return repeated

    def learn(self, chunks: Sequence[bytes | memoryview]) -> None:
        """Learn from the chunks of one call frame the encoder made (kept when they are no
        layout: the known one stays)."""
        if sum(memoryview(chunk).nbytes for chunk in chunks) > _MAX_LEARNED:
            return
        layout = CallLayout.learn(b"".join(chunks))
        if layout is not None:
            self.layout = layout

    def send(
        self,
        channel: FramedChannel,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        *,
        call_id: int,
        epoch: int,
        request_id: str,
        slots: dict[str, ArenaSlot],
    ) -> int | None:
        """:func:`send_call` by the learned layout (which ``inputs`` must fit)."""
        assert self.layout is not None
        copied = send_call(
            channel,
            self.layout,
            inputs,
            call_id=call_id,
            epoch=epoch,
            request_id=request_id,
            slots=slots,
        )
        if copied is not None:
            self.packed += 1
        return copied
