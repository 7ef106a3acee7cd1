"""Read a CTranslate2 Whisper model (``model.bin``) into NumPy arrays, without CTranslate2.

The binary format (little-endian; CTranslate2's ``ModelSpec._serialize``, binary version 6)::

    uint32  binary_version          (this reader accepts 5 and 6)
    string  spec_name               ("WhisperSpec")
    uint32  spec_revision
    uint32  variable_count
    variable_count times:
        string  name                ("encoder/layer_0/self_attention/linear_0/weight", ...)
        uint8   rank
        uint32  dims[rank]
        uint8   dtype               (0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16)
        uint32  byte_count
        bytes   data                (row-major)
    uint32  alias_count
    alias_count times:
        string  alias, string target    ("decoder/projection/weight" -> the embedding)

where a ``string`` is a uint16 length (counting a trailing NUL) followed by that many bytes.

CTranslate2's Whisper layout: each attention's ``linear_0`` fuses query, key and value in that
order in self-attention (the key's bias is stored as zeros: Whisper's key projection has none);
in cross-attention (``attention``) ``linear_0`` is the query and ``linear_1`` fuses key and value,
``linear_2`` is the output; ``decoder/projection`` is an alias of the token embedding (tied).
Every weight is ``[out_features, in_features]``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np

from runtime.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["CT2_DTYPES", "Ct2Model", "WhisperConvertError", "WhisperDims", "read_ct2_model"]

#: CTranslate2's ``DataType`` enum, in order.
CT2_DTYPES: Final = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
_ACCEPTED_VERSIONS: Final = (5, 6)
#: ``model.bin`` may not hold more variables than this (tiny.en has 148).
_MAX_VARIABLES: Final = 100_000


class WhisperConvertError(UsageError):
    """The Whisper model cannot be read or converted. ``code`` is stable; ``subject`` names
    what is at fault."""

    def __init__(self, message: str, *, code: str, subject: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.subject = subject


@dataclass(frozen=True, slots=True)
class WhisperDims:
    """The shape of a Whisper model, read from its tensors."""

    n_mels: int
    width: int
    heads: int
    encoder_layers: int
    decoder_layers: int
    vocab: int
    audio_positions: int
    text_positions: int

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


@dataclass(frozen=True, slots=True)
class Ct2Model:
    """A CTranslate2 model's variables (float32 copies) and aliases."""

    path: Path
    spec: str
    revision: int
    variables: Mapping[str, np.ndarray]
    aliases: Mapping[str, str]

    def get(self, name: str) -> np.ndarray:
        """A variable by name (aliases followed), as float32; WhisperConvertError if absent."""
        target = self.aliases.get(name, name)
        found = self.variables.get(target)
        if found is None:
            raise WhisperConvertError(
                f"{self.path}: variable {name!r} is missing; accepted: a CTranslate2 Whisper "
                "model (WhisperSpec)",
                code="missing_variable",
                subject=name,
            )
        return found

    def scalar(self, name: str) -> int:
        return int(self.get(name).reshape(-1)[0])

    def dims(self) -> WhisperDims:
        """The model's dimensions, checked against each other."""
        embedding = self.get("decoder/embeddings/weight")
        conv1 = self.get("encoder/conv1/weight")
        heads = self.scalar("encoder/num_heads")
        width = int(embedding.shape[1])
        encoder_layers = _count_layers(self.variables, "encoder")
        decoder_layers = _count_layers(self.variables, "decoder")
        if heads < 1 or width % heads or not encoder_layers or not decoder_layers:
            raise WhisperConvertError(
                f"{self.path}: {heads} heads of a {width}-wide model with {encoder_layers} "
                f"encoder and {decoder_layers} decoder layers; accepted: a width divisible by "
                "the heads and at least one layer each",
                code="bad_model",
                subject="encoder/num_heads",
            )
        return WhisperDims(
            n_mels=int(conv1.shape[1]),
            width=width,
            heads=heads,
            encoder_layers=encoder_layers,
            decoder_layers=decoder_layers,
            vocab=int(embedding.shape[0]),
            audio_positions=int(self.get("encoder/position_encodings/encodings").shape[0]),
            text_positions=int(self.get("decoder/position_encodings/encodings").shape[0]),
        )


def _count_layers(variables: Mapping[str, np.ndarray], side: str) -> int:
    count = 0
    while any(name.startswith(f"{side}/layer_{count}/") for name in variables):
        count += 1
    return count


class _Reader:
    def __init__(self, data: bytes, path: Path) -> None:
        self.data = data
        self.offset = 0
        self.path = path

    def take(self, count: int) -> bytes:
        end = self.offset + count
        if count < 0 or end > len(self.data):
            raise WhisperConvertError(
                f"{self.path} ends at byte {len(self.data)} where {count} more bytes were "
                f"expected at offset {self.offset}; accepted: a complete CTranslate2 model.bin",
                code="truncated",
                subject=str(self.path),
            )
        chunk = self.data[self.offset : end]
        self.offset = end
        return chunk

    def unpack(self, fmt: str) -> tuple[int, ...]:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))

    def string(self) -> str:
        (length,) = self.unpack("H")
        raw = self.take(length)
        if not raw or raw[-1] != 0:
            raise WhisperConvertError(
                f"{self.path}: a string at offset {self.offset - length} is not NUL-terminated; "
                "accepted: a CTranslate2 model.bin",
                code="bad_format",
                subject=str(self.path),
            )
        return raw[:-1].decode("utf-8")


def read_ct2_model(path: Path) -> Ct2Model:
    """Parse ``model.bin`` (see the module); every variable comes back as a float32 array
    (integer scalars too). Raises WhisperConvertError on anything else."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WhisperConvertError(
            f"cannot read {path}: {exc}", code="unreadable", subject=str(path)
        ) from None
    reader = _Reader(data, path)
    (version,) = reader.unpack("I")
    if version not in _ACCEPTED_VERSIONS:
        raise WhisperConvertError(
            f"{path}: binary version {version}; accepted: {list(_ACCEPTED_VERSIONS)}",
            code="bad_format",
            subject=str(path),
        )
    spec = reader.string()
    (revision,) = reader.unpack("I")
    (count,) = reader.unpack("I")
    if count > _MAX_VARIABLES:
        raise WhisperConvertError(
            f"{path}: {count} variables; accepted: at most {_MAX_VARIABLES}",
            code="bad_format",
            subject=str(path),
        )
    variables: dict[str, np.ndarray] = {}
    for _ in range(count):
        name = reader.string()
        (rank,) = reader.unpack("B")
        shape = reader.unpack("I" * rank)
        (dtype_id,) = reader.unpack("B")
        (nbytes,) = reader.unpack("I")
        raw = reader.take(nbytes)
        if dtype_id >= len(CT2_DTYPES) or CT2_DTYPES[dtype_id] == "bfloat16":
            raise WhisperConvertError(
                f"{path}: variable {name!r} has dtype id {dtype_id}; accepted: "
                f"{', '.join(d for d in CT2_DTYPES if d != 'bfloat16')}",
                code="bad_dtype",
                subject=name,
            )
        dtype = np.dtype(CT2_DTYPES[dtype_id]).newbyteorder("<")
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if expected != nbytes:
            raise WhisperConvertError(
                f"{path}: variable {name!r} of shape {list(shape)} and dtype {dtype.name} "
                f"holds {nbytes} bytes; accepted: {expected}",
                code="bad_format",
                subject=name,
            )
        array = np.frombuffer(raw, dtype=dtype).reshape(shape)
        variables[name] = array.astype(np.float32)
    (alias_count,) = reader.unpack("I")
    aliases: dict[str, str] = {}
    for _ in range(alias_count):
        alias = reader.string()
        aliases[alias] = reader.string()
    if reader.offset != len(data):
        raise WhisperConvertError(
            f"{path}: {len(data) - reader.offset} bytes follow the aliases; accepted: a "
            "CTranslate2 model.bin and nothing after it",
            code="bad_format",
            subject=str(path),
        )
    if spec != "WhisperSpec":
        raise WhisperConvertError(
            f"{path}: a {spec!r} model; accepted: WhisperSpec",
            code="not_whisper",
            subject=spec,
        )
    return Ct2Model(path, spec, revision, variables, aliases)
