"""A chunked HTTP/1.1 body, decoded as its reads come (RFC 9112 §7.1), sans-IO.

A streamed response (an LLM's server-sent events) comes as one small chunk per token, and each
one read alone: aiohttp's parser hands every chunk to its ``StreamReader`` through three Python
calls, and the reader gives it back through three more. :class:`ChunkedBody` takes a read's
bytes and returns the body bytes in them, in one call.

It stops at the last chunk (size 0) and returns the bytes from that chunk's size line on: the
trailer section and whatever follows are then the HTTP parser's again, which sees a body whose
chunks it was never shown end as an empty one, and completes the message as it would have.

The sizes are the server's: they are counted down, never used to size a buffer. A size line
longer than :data:`MAX_SIZE_LINE` bytes, a size that is not hexadecimal, or a chunk that does
not end in CRLF raises :class:`ChunkedBodyError`.
"""

from __future__ import annotations

import re

__all__ = ["MAX_SIZE_LINE", "ChunkedBody", "ChunkedBodyError"]

MAX_SIZE_LINE = 4096  # a size and its extensions; llhttp's own limit is of this order
_HEX = b"0123456789abcdefABCDEF"
_MAX_DIGITS = 16  # a 64-bit size: what llhttp accepts


# what a size line may hold besides its digits: visible characters, spaces and tabs (no
# control character: a CR, LF or NUL inside it is where two parsers would disagree)
_LINE_TEXT = re.compile(rb"[\t\x20-\x7e\x80-\xff]*\Z")


class ChunkedBodyError(ValueError):
    """The body's chunked framing is broken: the message says where.

    Attributes:
        body: the body bytes the read held before the break (whole chunks and the part of
            one that came), which are as good as any that came before.
    """

    body = b""


def _size(line: bytes) -> int:
    """The chunk size in a size line (without its CRLF): hexadecimal digits, then maybe
    ``;`` extensions, which are ignored."""
    if 0 < len(line) <= _MAX_DIGITS and not line.strip(_HEX):  # digits only: every chunk
        return int(line, 16)
    digits = line.split(b";", 1)[0].rstrip(b" \t")
    significant = digits.lstrip(b"0") or digits[:1]  # leading zeros are no part of the limit
    if not 0 < len(significant) <= _MAX_DIGITS or digits.strip(_HEX) or not _LINE_TEXT.match(line):
        shown = line[:40].decode("ascii", "backslashreplace")
        raise ChunkedBodyError(f"bad chunk size line {shown!r}")
    return int(digits, 16)


class ChunkedBody:
    """The decoding state of one chunked body between reads."""

    __slots__ = ("_crlf", "_left", "_line", "received")

    def __init__(self) -> None:
        self._left = 0  # bytes of the current chunk's data still to come
        self._crlf = b""  # the part of a chunk's closing CRLF still to come
        self._line = b""  # a size line cut by the end of a read
        self.received = 0  # body bytes decoded so far

    def feed(self, data: bytes) -> tuple[bytes, bytes | None]:
        """The body bytes in ``data`` (a read), and, once the last chunk's size line has
        begun, the bytes from its start on (None before): the end of the message, for the
        HTTP parser."""
        if not (self._left or self._crlf or self._line):  # the common read: one whole chunk
            eol = data.find(b"\r\n", 0, _MAX_DIGITS + 2)
            if eol > 0:
                line = data[:eol]
                if not line.strip(_HEX):
                    size = int(line, 16)
                    stop = eol + 2 + size
                    if size and len(data) == stop + 2 and data[stop:] == b"\r\n":
                        self.received += size
                        return data[eol + 2 : stop], None
        elif self._line:
            data, self._line = self._line + data, b""
        pieces: list[bytes] = []
        try:
            return self._decode(data, pieces)
        except ChunkedBodyError as exc:
            exc.body = _joined(pieces) if pieces else b""
            self.received += len(exc.body)
            raise

    def _decode(self, data: bytes, pieces: list[bytes]) -> tuple[bytes, bytes | None]:
        pos, end = 0, len(data)
        while pos < end:
            left = self._left
            if left:  # inside a chunk's data
                stop = pos + left
                if stop > end:
                    pieces.append(data[pos:] if pos else data)
                    self._left = stop - end
                    break
                pieces.append(data[pos:stop])
                self._left, self._crlf, pos = 0, b"\r\n", stop
            crlf = self._crlf
            if crlf:  # the CRLF that closes a chunk's data
                if crlf == b"\r\n" and data[pos : pos + 1] == b"\n":  # a bare LF: aiohttp's too
                    crlf = b"\n"
                got = data[pos : pos + len(crlf)]
                if not crlf.startswith(got):
                    raise ChunkedBodyError("a chunk's data did not end with CRLF")
                pos += len(got)
                self._crlf = crlf[len(got) :]
                if self._crlf:
                    break
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                if end - pos > MAX_SIZE_LINE:
                    raise ChunkedBodyError(f"chunk size line longer than {MAX_SIZE_LINE} bytes")
                self._line = data[pos:]
                break
            if eol - pos > MAX_SIZE_LINE:
                raise ChunkedBodyError(f"chunk size line longer than {MAX_SIZE_LINE} bytes")
            size = _size(data[pos:eol])
            if not size:  # the last chunk: the rest is the parser's
                body = _joined(pieces)
                self.received += len(body)
                return body, data[pos:]
            self._left, pos = size, eol + 2
        body = _joined(pieces)
        self.received += len(body)
        return body, None


def _joined(pieces: list[bytes]) -> bytes:
    if len(pieces) == 1:
        return pieces[0]
    return b"".join(pieces)
