"""The wire format between the trusted grader and the sandbox: data only, never pickles.

A message is one frame::

    b"CKIT" | header length (4 bytes, big-endian) | blob length (8 bytes) | header | blob

The header is UTF-8 JSON; the blob is an ``.npz`` archive holding the arrays the
header refers to, stored uncompressed and read back member by member with
``numpy.lib.format`` (no pickles, and every array's size is checked against the bytes that
really arrived before anything is allocated). File
descriptors (a fresh socket for a new process) travel beside a frame with
``SCM_RIGHTS``.

Values are encoded by :func:`encode` into JSON plus arrays and rebuilt by
:func:`decode`. Tensors come back as plain ``torch.Tensor`` objects (never a
subclass); anything that is not data (a module, a function) stays in the sandbox
and crosses as a *handle*, ``{"$h": id}``, which the trusted side wraps in a proxy.
Both directions use the same code, but the trusted side treats every frame it
reads as hostile: sizes are capped, nesting is bounded, and a malformed frame
raises :class:`ProtocolError`.
"""

from __future__ import annotations

import base64
import io
import json
import math
import socket
import struct
import time
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np

#: bound when the module is imported (before any student code runs): a cell that swaps
#: ``np.savez`` for ``np.savez_compressed`` does not change how answers are written
_savez = np.savez

MAGIC = b"CKIT"
_PREFIX = struct.Struct(">4sIQ")
MAX_HEADER = 32 << 20  # bytes of JSON in one frame
MAX_BLOB = 512 << 20  # bytes of arrays in one frame
MAX_DEPTH = 32  # nesting of lists, tuples and dicts
MAX_ITEMS = 1_000_000  # values in one message
MAX_ARRAYS = 10_000  # arrays in one frame
_MEMBER_OVERHEAD = 1024  # at least the bytes one array adds to an archive beyond its data
#: what the trusted side accepts from a student's process: the answer of one call, or the
#: outputs of one cell. Arrays are stored uncompressed, so these bound the memory an answer
#: takes once read (a compressed archive could inflate a megabyte into gigabytes).
REPLY_HEADER = 8 << 20
REPLY_BLOB = 128 << 20

#: How long the template waits for a submission's processes to go once it has killed them. On a busy
#: machine a killed process that lowered its own priority takes seconds of wall time to end; the host
#: waits this long more for the template's answer to any command (its watch may be killing).
KILL_SECONDS = 10.0

#: dtypes that cross as themselves; bfloat16 and float16 cross as float32 and are cast back
_DTYPES = {
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
    "complex64",
    "complex128",
}


class ProtocolError(Exception):
    """The other side sent something that is not a valid message."""


class Closed(ProtocolError):
    """The other side closed the connection (its process ended)."""


class TimedOut(ProtocolError):
    """No complete message arrived before the deadline."""


# --------------------------------------------------------------------------- frames


def send(
    sock: socket.socket,
    header: dict,
    arrays: dict[str, np.ndarray] | None = None,
    fds: list[int] = (),
    max_blob: int | None = None,
) -> None:
    """Send one frame (and optionally file descriptors) on ``sock``.

    With ``max_blob``, arrays larger than that in all are refused with :class:`ValueError` before
    they are written out (the reader would refuse them anyway, after this side had doubled its
    memory to build them)."""
    head = json.dumps(header, allow_nan=False, separators=(",", ":")).encode()
    blob = b""
    if arrays:
        # the archive's bytes: the arrays, and for each a few hundred bytes of .npy and zip headers
        size = sum(int(np.asarray(a).nbytes) + _MEMBER_OVERHEAD for a in arrays.values())
        if max_blob is not None and size > max_blob:
            raise ValueError(
                f"an answer of {size:,} bytes of arrays exceeds the limit of {max_blob:,} bytes ({_mib(max_blob)})"
            )
        buf = io.BytesIO()
        _savez(buf, **arrays)  # stored, not compressed: the reader refuses compressed members
        blob = buf.getbuffer()
    prefix = _PREFIX.pack(MAGIC, len(head), len(blob))
    if fds:
        socket.send_fds(sock, [prefix], list(fds))
        sock.sendall(head)
    else:
        sock.sendall(prefix + head)
    if len(blob):
        sock.sendall(blob)  # no copy of what may be 100 MiB


def recv(
    sock: socket.socket,
    deadline: float | None = None,
    *,
    max_blob: int = MAX_BLOB,
    max_header: int = MAX_HEADER,
    want_fds: bool = False,
):
    """Read one frame; return ``(header, arrays, fds)``.

    ``deadline`` is a ``time.monotonic()`` value; past it :class:`TimedOut` is raised. A frame
    whose header or arrays are larger than ``max_header`` or ``max_blob`` bytes is refused with
    :class:`ProtocolError` before it is read.
    """
    fds: list[int] = []
    if want_fds:
        _settimeout(sock, deadline)
        try:
            first, fds, _flags, _addr = socket.recv_fds(sock, _PREFIX.size, 4)
        except TimeoutError as e:
            raise TimedOut("no answer in time") from e
        except OSError as e:
            raise Closed(str(e)) from e
        if not first:
            raise Closed("connection closed")
        prefix = first + _read_exact(sock, _PREFIX.size - len(first), deadline)
    else:
        prefix = _read_exact(sock, _PREFIX.size, deadline)
    magic, n_head, n_blob = _PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise ProtocolError("not a coursekit frame")
    if n_head > max_header:
        raise ProtocolError(f"message of {_mib(n_head)} of data exceeds the limit of {_mib(max_header)}")
    if n_blob > max_blob:
        raise ProtocolError(f"message of {_mib(n_blob)} of arrays exceeds the limit of {_mib(max_blob)}")
    try:
        header = json.loads(_read_exact(sock, n_head, deadline))
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"malformed header: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    arrays: dict[str, np.ndarray] = {}
    if n_blob:
        arrays = read_arrays(_read_exact(sock, n_blob, deadline))
    return header, arrays, fds


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def read_arrays(blob: bytes) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` archive written by :func:`send`, read as hostile data.

    Every member must be stored uncompressed (so the arrays take no more memory than the bytes
    that arrived), be a ``.npy`` file of a plain dtype (no Python objects), and hold exactly the
    bytes its header's shape and dtype call for; the check comes before any allocation.

    Raises:
        ProtocolError: naming what is wrong with the archive.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            members = archive.infolist()
            if len(members) > MAX_ARRAYS:
                raise ProtocolError(f"malformed array archive: more than {MAX_ARRAYS} arrays")
            arrays = {}
            for info in members:
                if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
                    raise ProtocolError("malformed array archive: compressed arrays are not accepted")
                if not info.filename.endswith(".npy"):
                    raise ProtocolError(f"malformed array archive: unexpected member {info.filename[:40]!r}")
                arrays[info.filename[: -len(".npy")]] = _read_npy(archive.read(info))
            return arrays
    except ProtocolError:
        raise
    except Exception as e:  # any failure to parse the archive is the other side's fault
        raise ProtocolError(f"malformed array archive: {type(e).__name__}: {e}") from None


def _read_npy(data: bytes) -> np.ndarray:
    fmt = np.lib.format
    stream = io.BytesIO(data)
    version = fmt.read_magic(stream)
    if version == (1, 0):
        shape, fortran, dtype = fmt.read_array_header_1_0(stream)
    elif version == (2, 0):
        shape, fortran, dtype = fmt.read_array_header_2_0(stream)
    else:
        raise ProtocolError(f"malformed array archive: .npy version {version}")
    if dtype.hasobject:
        raise ProtocolError("malformed array archive: arrays of Python objects are not accepted")
    count = math.prod(shape)
    body = memoryview(data)[stream.tell() :]
    if count * dtype.itemsize != len(body):
        raise ProtocolError(
            f"malformed array archive: an array of shape {shape} and dtype {dtype} "
            f"needs {count * dtype.itemsize} bytes, got {len(body)}"
        )
    array = np.frombuffer(body, dtype=dtype, count=count).copy()
    return array.reshape(shape[::-1]).transpose() if fortran else array.reshape(shape)


def _settimeout(sock: socket.socket, deadline: float | None) -> None:
    if deadline is None:
        sock.settimeout(None)
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimedOut("no answer in time")
    sock.settimeout(left)


def _read_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        _settimeout(sock, deadline)
        try:
            chunk = sock.recv(min(n - got, 1 << 20))
        except TimeoutError as e:
            raise TimedOut("no answer in time") from e
        except OSError as e:
            raise Closed(str(e)) from e
        if not chunk:
            raise Closed("connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------- values


class Opaque:
    """A value that the sandbox could not send as data (shown by type name in hints)."""

    def __init__(self, type_name: str, why: str = ""):
        self.type_name = type_name
        self.why = why

    def __repr__(self) -> str:
        return f"<{self.type_name} from the sandbox>"


def encode(
    value: Any, arrays: dict[str, np.ndarray], handle: Callable[[Any], dict] | None = None, _depth: int = 0
) -> Any:
    """JSON-able form of ``value``; arrays are stored in ``arrays``.

    ``handle(obj)`` is called for objects that are not data; without it they are
    an error.
    """
    import torch

    if _depth > MAX_DEPTH:
        raise ValueError(f"value nested more than {MAX_DEPTH} levels deep")
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if t is int:
        return value if abs(value) < 2**63 else {"$int": str(value)}
    if t is float:
        return value if math.isfinite(value) else {"$f": repr(value)}
    if t is torch.Tensor or t is torch.nn.Parameter:
        x = value.detach().cpu()
        dtype = str(x.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            return {"$opaque": f"tensor of dtype {dtype}"}
        if dtype in ("bfloat16", "float16"):
            x = x.float()
        key = f"a{len(arrays)}"
        arrays[key] = x.resolve_conj().resolve_neg().numpy().copy()
        return {"$t": key, "dtype": dtype, "grad": bool(value.requires_grad)}
    if t is np.ndarray and value.dtype != object:
        key = f"a{len(arrays)}"
        arrays[key] = value
        return {"$a": key}
    if isinstance(value, np.generic) and t.__module__ == "numpy" and not isinstance(value, np.object_):
        key = f"a{len(arrays)}"
        arrays[key] = np.asarray(value)
        return {"$np": key}
    if t is torch.dtype:
        return {"$dtype": str(value).removeprefix("torch.")}
    if t is torch.Size:
        return {"$size": [int(v) for v in value]}
    if t is bytes:
        return {"$b": base64.b64encode(value).decode()}
    if t is slice:
        return {
            "$slice": [encode(v, arrays, handle, _depth + 1) for v in (value.start, value.stop, value.step)]
        }
    if value is Ellipsis:
        return {"$ellipsis": True}
    if t is list:
        return [encode(v, arrays, handle, _depth + 1) for v in value]
    if t is tuple:
        return {"$tuple": [encode(v, arrays, handle, _depth + 1) for v in value]}
    if t in (set, frozenset):
        return {"$set": [encode(v, arrays, handle, _depth + 1) for v in value]}
    if isinstance(
        value, dict
    ):  # Counter, defaultdict, OrderedDict arrive as plain dicts (read with dict.items)
        items = dict.items(value)
        return {
            "$dict": [
                [encode(k, arrays, handle, _depth + 1), encode(v, arrays, handle, _depth + 1)]
                for k, v in items
            ]
        }
    if handle is not None:
        return handle(value)
    raise TypeError(f"cannot send a {t.__name__} to the sandbox")


def decode(obj: Any, arrays: dict[str, np.ndarray], handle: Callable[[dict], Any] | None = None) -> Any:
    """Rebuild a value encoded by :func:`encode`; raises :class:`ProtocolError` if malformed."""
    budget = [MAX_ITEMS]
    try:
        return _decode(obj, arrays, handle, 0, budget)
    except ProtocolError:
        raise
    except Exception as e:  # malformed input of any kind
        raise ProtocolError(f"malformed value: {type(e).__name__}: {e}") from None


def _decode(obj, arrays, handle, depth, budget):
    import torch

    budget[0] -= 1
    if budget[0] < 0:
        raise ProtocolError(f"message holds more than {MAX_ITEMS} values")
    if depth > MAX_DEPTH:
        raise ProtocolError(f"value nested more than {MAX_DEPTH} levels deep")
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj
    if isinstance(obj, list):
        return [_decode(v, arrays, handle, depth + 1, budget) for v in obj]
    if not isinstance(obj, dict) or len(obj) == 0:
        raise ProtocolError(f"unexpected {type(obj).__name__} in a message")
    tag = next(iter(obj))
    if tag == "$t":
        array = _array(arrays, obj["$t"])
        dtype = obj.get("dtype")
        if dtype not in _DTYPES:
            raise ProtocolError(f"unknown dtype {dtype!r}")
        x = torch.from_numpy(array.copy())
        if dtype in ("bfloat16", "float16"):
            x = x.to(getattr(torch, dtype))
        elif str(x.dtype).removeprefix("torch.") != dtype:
            raise ProtocolError(f"tensor claims dtype {dtype} but holds {x.dtype}")
        if obj.get("grad") is True and x.is_floating_point():
            x.requires_grad_(True)
        return x
    if tag == "$a":
        return _array(arrays, obj["$a"]).copy()
    if tag == "$np":
        return _array(arrays, obj["$np"])[()]
    if tag == "$int":
        return int(obj["$int"])
    if tag == "$f":
        if obj["$f"] not in ("nan", "inf", "-inf"):
            raise ProtocolError("bad float")
        return float(obj["$f"])
    if tag == "$dtype":
        value = getattr(torch, str(obj["$dtype"]), None)
        if not isinstance(value, torch.dtype):
            raise ProtocolError(f"unknown dtype {obj['$dtype']!r}")
        return value
    if tag == "$size":
        return torch.Size([int(v) for v in obj["$size"]])
    if tag == "$b":
        return base64.b64decode(obj["$b"], validate=True)
    if tag == "$slice":
        return slice(*(_decode(v, arrays, handle, depth + 1, budget) for v in obj["$slice"]))
    if tag == "$ellipsis":
        return Ellipsis
    if tag == "$tuple":
        return tuple(_decode(v, arrays, handle, depth + 1, budget) for v in obj["$tuple"])
    if tag == "$set":
        return set(_decode(v, arrays, handle, depth + 1, budget) for v in obj["$set"])
    if tag == "$dict":
        return {
            _decode(k, arrays, handle, depth + 1, budget): _decode(v, arrays, handle, depth + 1, budget)
            for k, v in obj["$dict"]
        }
    if tag == "$opaque":
        return Opaque(str(obj["$opaque"])[:200])
    if tag in ("$h", "$ref") and handle is not None:
        return handle(obj)
    raise ProtocolError(f"unknown tag {str(tag)[:40]!r}")


def _array(arrays, key) -> np.ndarray:
    if not isinstance(key, str) or key not in arrays:
        raise ProtocolError(f"missing array {str(key)[:40]!r}")
    return arrays[key]


def shares_memory(result: object, args: list | tuple, kwargs: dict) -> bool:
    """A tensor of ``result`` (or of a tuple or list of results) shares memory with a tensor in
    ``args`` or ``kwargs``: it is an argument, or a view of one. Empty tensors share nothing."""

    import torch  # not at import: this module also serves processes that never load torch

    def storages(values) -> set[int]:
        return {
            v.untyped_storage().data_ptr()
            for v in values
            if isinstance(v, torch.Tensor) and v.device.type != "meta" and v.untyped_storage().nbytes()
        }

    outs = result if isinstance(result, (tuple, list)) else (result,)
    return bool(storages(outs) & storages([*args, *kwargs.values()]))
