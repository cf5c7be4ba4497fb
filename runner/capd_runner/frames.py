"""Frame writer for the runner protocol (docs/protocol.md).

A frame is one line of compact JSON (the header, at most MAX_HEADER bytes
including the newline) followed by exactly ``nbytes`` payload bytes. Frames
are collected in a small buffer and written with one ``os.writev`` per flush;
a frame with a large payload is written at once, header and payload in the
same system call, without copying the payload.

A closed pipe (EPIPE) means capd is gone or has given up on the cell: the
runner leaves at once, quietly, with EXIT_PIPE.
"""

import errno
import json
import math
import os
import sys

MAX_HEADER = 65536
EXIT_PIPE = 3
# Buffered bytes past which flush() happens on its own.
FLUSH_AT = 64 * 1024
# Payloads at least this large skip the buffer (written right away, no copy).
DIRECT_PAYLOAD = 16 * 1024
IOV_MAX = 512


class HeaderTooLarge(ValueError):
    pass


def encode_header(header):
    line = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8") + b"\n"
    if len(line) > MAX_HEADER:
        raise HeaderTooLarge("frame header of kind %r is %d bytes (limit %d)"
                             % (header.get("kind"), len(line), MAX_HEADER))
    return line


try:
    from json.encoder import encode_basestring_ascii as _json_str
except ImportError:  # pragma: no cover (always there in CPython)
    def _json_str(s):
        return json.dumps(s)

_float_repr = float.__repr__
_int_repr = int.__repr__


def _json_scalar(v):
    """A stats value exactly as json.dumps writes it (ints, finite floats,
    None); anything else raises ValueError and the caller falls back."""
    if v is None:
        return "null"
    tv = type(v)
    if tv is float:
        if not math.isfinite(v):
            raise ValueError(v)
        return _float_repr(v)
    if tv is int:
        return _int_repr(v)
    raise ValueError(v)


# Texts that repeat from record to record (module names, phases, roles,
# dtypes; shapes), each made once: a capture hook builds a header per
# record. Bounded: past CACHE_MAX entries a cache starts again.
CACHE_MAX = 4096
_JSON_TEXT = {}
_SHAPE_TEXT = {}


def _json_cached(s):
    j = _JSON_TEXT.get(s)
    if j is None:
        if len(_JSON_TEXT) >= CACHE_MAX:
            _JSON_TEXT.clear()
        j = _JSON_TEXT[s] = _json_str(s)
    return j


def _shape_text(shape):
    try:
        text = _SHAPE_TEXT.get(shape)
    except TypeError:  # a list: not a key
        return ",".join([_int_repr(int(d)) for d in shape])
    if text is None:
        if len(_SHAPE_TEXT) >= CACHE_MAX:
            _SHAPE_TEXT.clear()
        text = _SHAPE_TEXT[shape] = ",".join([_int_repr(int(d)) for d in shape])
    return text


def tensor_header_prefix(seq, key, module, call, phase, role, index, dtype, shape, numel,
                         op=None):
    """The start of a ``tensor`` header, exactly as encode_header writes the
    same dict (compact separators, ASCII escapes), up to before ``stats``.
    ``op``: (ATen name, occurrence) of a per-op record, written as the
    ``op`` and ``op_index`` fields after ``numel``; a third item, the
    compact ASCII JSON text of a targeted call's ``op_call`` field
    (opcapture.py), follows them."""
    line = ('{"kind":"tensor","seq":%d,"key":%s,"module":%s,"call":%d,"phase":%s,"role":%s,'
            '"index":%s,"dtype":%s,"shape":[%s],"numel":%d'
            % (seq, _json_str(key), _json_cached(module), call, _json_cached(phase),
               _json_cached(role), _int_repr(index) if type(index) is int else _json_str(index),
               _json_cached(dtype), _shape_text(shape), numel))
    if op is not None:
        line += ',"op":%s,"op_index":%d' % (_json_str(op[0]), op[1])
        if len(op) > 2:
            line += ',"op_call":' + op[2]
    return line


def tensor_header_line(prefix, stats, hash_hex, capture, nbytes, hash_alg):
    """The whole ``tensor`` header line (bytes): ``prefix`` (see
    tensor_header_prefix) then stats, hash, hash_alg, capture,
    sample_positions (for samples) and nbytes (when > 0), the key order of
    the runner's dict."""
    if stats is None:
        st = "null"
    else:
        # In the dict's own order, like json.dumps (the non-finite path
        # builds its dict in another order than the common one).
        st = "{" + ",".join([_json_str(k) + ":" + _json_scalar(v)
                             for k, v in stats.items()]) + "}"
    tail = ',"stats":%s,"hash":%s,"hash_alg":%s,"capture":"%s"' % (
        st, _json_str(hash_hex), _json_str(hash_alg), capture)
    if capture == "sample":
        tail += ',"sample_positions":"stride"'
    if nbytes:
        tail += ',"nbytes":%d' % nbytes
    line = (prefix + tail + "}\n").encode("ascii")
    if len(line) > MAX_HEADER:
        raise HeaderTooLarge("frame header of kind 'tensor' is %d bytes (limit %d)"
                             % (len(line), MAX_HEADER))
    return line


class FrameWriter(object):
    def __init__(self, fd):
        self.fd = fd
        self._parts = []
        self._pending = 0
        self.frames = 0
        self.payload_bytes = 0
        self.ended = False

    # -- low level -------------------------------------------------------
    def _write_all(self, parts):
        parts = [memoryview(p).cast("B") for p in parts if len(p)]
        while parts:
            try:
                n = os.writev(self.fd, parts[:IOV_MAX])
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno == errno.EPIPE:
                    self._pipe_closed()
                raise
            while n and parts:
                head = parts[0]
                if n >= len(head):
                    n -= len(head)
                    parts.pop(0)
                else:
                    parts[0] = head[n:]
                    n = 0

    def _pipe_closed(self):
        # Nobody reads the frames any more: nothing useful is left to do.
        try:
            sys.stderr.flush()
        except Exception:
            pass
        os._exit(EXIT_PIPE)

    def flush(self):
        if self._parts:
            parts, self._parts, self._pending = self._parts, [], 0
            self._write_all(parts)

    # -- frames ----------------------------------------------------------
    def frame(self, header, payload=None):
        """Queue one frame. ``payload`` is any bytes-like object (or None);
        it must stay valid until this call returns."""
        if self.ended:
            raise RuntimeError("frame after end")
        if payload is not None and len(payload):
            header["nbytes"] = len(payload)
        self.frame_line(encode_header(header), payload)

    def frame_line(self, line, payload=None):
        """Queue one frame whose header is already encoded (``line``: bytes
        ending in a newline, with ``nbytes`` matching ``payload``)."""
        if self.ended:
            raise RuntimeError("frame after end")
        n = len(payload) if payload is not None else 0
        self.frames += 1
        self.payload_bytes += n
        if n >= DIRECT_PAYLOAD:
            parts, self._parts, self._pending = self._parts, [], 0
            parts.append(line)
            parts.append(payload)
            self._write_all(parts)
            return
        self._parts.append(line)
        self._pending += len(line)
        if n:
            self._parts.append(bytes(payload))
            self._pending += n
        if self._pending >= FLUSH_AT:
            self.flush()

    def hello(self, protocol, runner):
        self.frame({"kind": "hello", "protocol": protocol, "runner": runner})
        self.flush()

    def note(self, level, message):
        message = str(message)
        header = {"kind": "note", "level": level, "message": message}
        # Keep the end of long messages (a traceback's last lines matter most).
        while True:
            try:
                self.frame(header)
                break
            except HeaderTooLarge:
                message = "...[truncated]\n" + message[len(message) // 2:]
                header["message"] = message
        self.flush()

    def nondeterministic(self, keys):
        """The nondeterministic frame of KEYS: one frame, or several when
        the list would not fit one header."""
        chunk = []
        size = 64
        for k in keys:
            if chunk and size + len(k) + 8 > MAX_HEADER - 1024:
                self.frame({"kind": "nondeterministic", "keys": chunk})
                chunk, size = [], 64
            chunk.append(k)
            size += len(k) + 8
        self.frame({"kind": "nondeterministic", "keys": chunk})
        self.flush()

    def end(self, status, reason=None):
        header = {"kind": "end", "status": status}
        if reason:
            header["reason"] = _fit(reason, 8192)
        self.frame(header)
        self.flush()
        self.ended = True


def _fit(text, limit):
    text = str(text)
    return text if len(text) <= limit else text[:limit - 15] + "...[truncated]"
