"""The bytes a remote cache store keeps: a versioned entry blob and a float16 unit vector.

An entry is a fixed header (magic `QGC1`, then the byte lengths of key, question and payload)
followed by the three; anything else is refused with ValueError, so that a store can delete a
garbled entry instead of serving it. A vector is little-endian float16 (768 bytes at 384
dimensions): half the bytes of float32, well within the precision a cosine threshold needs.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from backends.cache.base import CachedEntry
from backends.retrieval.base import Vector

_ENTRY_MAGIC = b"QGC1"
_ENTRY_HEADER = struct.Struct(">4sIII")  # magic, then lengths of key, question, payload
_VECTOR_DTYPE = "<f2"


def encode_entry(entry: CachedEntry) -> bytes:
    """The entry's key, question and payload; its vector is stored apart (`encode_vector`)."""
    key, question = entry.key.encode(), entry.question.encode()
    header = _ENTRY_HEADER.pack(_ENTRY_MAGIC, len(key), len(question), len(entry.payload))
    return header + key + question + entry.payload


def decode_entry(blob: bytes, vector: bytes) -> CachedEntry:
    """The stored entry (with its vector, b"" for none), or ValueError for anything that is
    not one."""
    if len(blob) < _ENTRY_HEADER.size:
        raise ValueError("entry shorter than its header")
    magic, key_len, question_len, payload_len = _ENTRY_HEADER.unpack_from(blob)
    if magic != _ENTRY_MAGIC:
        raise ValueError("unknown entry format")
    start = _ENTRY_HEADER.size
    if start + key_len + question_len + payload_len != len(blob):
        raise ValueError("entry lengths do not add up")
    key = blob[start : start + key_len].decode()
    question = blob[start + key_len : start + key_len + question_len].decode()
    payload = blob[start + key_len + question_len :]
    return CachedEntry(key, question, payload, decode_vector(vector) if vector else None)


def encode_vector(unit: Vector) -> bytes:
    return unit.astype(_VECTOR_DTYPE).tobytes()


def vector_size(dimension: int) -> int:
    """Bytes of an encoded vector of `dimension`."""
    return dimension * np.dtype(_VECTOR_DTYPE).itemsize


def decode_vector(raw: bytes) -> Vector:
    if not raw or len(raw) % 2:
        raise ValueError("vector bytes are not float16")
    vector = np.frombuffer(raw, dtype=_VECTOR_DTYPE).astype(np.float32)
    if not np.all(np.isfinite(vector)):
        raise ValueError("vector is not finite")
    return vector


def decode_vector_rows(raws: Sequence[bytes]) -> npt.NDArray[np.float16]:
    """Encoded vectors of one dimension as the rows of one matrix, decoded in a single numpy
    call (a lookup decodes its whole candidate set); rows may be non-finite: the caller
    checks."""
    rows: npt.NDArray[np.float16] = np.frombuffer(b"".join(raws), dtype=_VECTOR_DTYPE)
    return rows.reshape(len(raws), -1)
