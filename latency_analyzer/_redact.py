"""The one place where credentials are taken out of everything the library shows or writes.

A latency tool is pointed at production endpoints with production keys, and servers, proxies
and aiohttp quote the request back: an exception names the full URL, a 401 body repeats the
key, an invalid response echoes the request line. Every message, URL, header, body excerpt and
export passes through this module before anyone sees it. What it removes, in order:

1. **Values the requests carried.** Each request registers its secret values
   (:func:`remember_request`): the values of secret headers (and the credential after a scheme
   word such as ``Bearer``), the values of secret query keys, the URL's user and password (and
   their HTTP Basic form). Every value of :data:`MIN_EXACT` characters or more is replaced by
   ``***`` wherever it appears, in any later text of this process. Shorter values are still
   removed where they stand (header, query key, userinfo) but not searched for in free text:
   they would match ordinary words.
2. **Known key shapes** (:data:`KEY_SHAPES`): ``Bearer …`` / ``Basic …`` / ``Token …`` /
   ``Digest …``, ``sk-…``, JWTs, AWS access key ids, GitHub, Google, Slack and Hugging Face
   tokens.
3. **Userinfo** of any URL in text: ``scheme://user:pass@`` becomes ``scheme://***@``.
4. **Secret query keys** (:func:`is_secret_query_key`) of any URL in text, and
   ``name=value`` / ``"name": "value"`` / ``Header-Name: value`` pairs whose name is secret
   (:func:`is_secret_name`).

Names: a header or attribute name is secret when it is one of :data:`SECRET_HEADERS` or
contains ``key``, ``token``, ``secret``, ``auth``, ``cookie``, ``passw``, ``pwd``,
``signature`` or ``credential``, in any case. ``token`` is not secret where it names a count
or a timing: ``tokens``, ``token_count``, ``tokenizer``, ``first_token``, ``per_token`` (and
``last``/``next``/``output`` before it). A query key is secret when it is one of
:data:`SECRET_QUERY_KEYS` or its name is secret.
"""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, unquote, unquote_plus, urlsplit, urlunsplit

__all__ = [
    "KEY_SHAPES",
    "MASK",
    "MIN_EXACT",
    "SECRET_HEADERS",
    "SECRET_QUERY_KEYS",
    "forget_all",
    "is_secret_name",
    "is_secret_query_key",
    "redact_headers",
    "redact_obj",
    "redact_text",
    "redact_url",
    "remember",
    "remember_request",
]

#: What a removed value is replaced with.
MASK = "***"
#: Shortest remembered value searched for in free text.
MIN_EXACT = 8
#: Most remembered values kept (the most recently used ones).
_MAX_REMEMBERED = 256

#: Headers whose values are always secret.
SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "api-key", "x-api-key", "cookie", "set-cookie"}
)
#: Query keys whose values are always secret (compared case-insensitively).
SECRET_QUERY_KEYS = frozenset(
    {
        "key",
        "api_key",
        "api-key",
        "apikey",
        "token",
        "access_token",
        "refresh_token",
        "id_token",
        "password",
        "passwd",
        "pwd",
        "secret",
        "client_secret",
        "signature",
        "sig",
        "code",
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
    }
)

# ``token`` names a credential except where it names a count or a timing: ``x-prompt-tokens``,
# ``llm.token_count.prompt``, ``detokenize``, ``time_to_first_token``, ``x-time-per-token``
_SECRET_NAME = re.compile(
    r"key|secret|auth|cookie|passw|pwd|signature|credential"
    r"|(?<!first.)(?<!last.)(?<!next.)(?<!per.)(?<!output.)token(?!s|iz|_?count)",
    re.IGNORECASE,
)

#: Credential shapes recognised in any text, whatever carried them.
KEY_SHAPES: tuple[re.Pattern[str], ...] = (
    re.compile(r"\b(?i:bearer|basic|token|digest)\s+[A-Za-z0-9._~+/=-]{6,}"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"),
    re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"),  # JWT
    re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),  # GitHub
    re.compile(r"\bAIza[0-9A-Za-z_-]{30,}"),  # Google API key
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),  # Slack
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),  # Hugging Face
)

_ANY_SHAPE = re.compile("|".join(f"(?:{p.pattern})" for p in KEY_SHAPES))
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@?#'\"<>]*@")
# name=value inside a URL's query, or a ``name=value`` / ``"name": "value"`` pair in text
_QUERY_PAIR = re.compile(r"([?&;])([^=&#\s'\"<>?]+)=([^&#\s'\"<>]*)")
_TEXT_PAIR = re.compile(
    r"(?P<q>[\"']?)(?P<name>[A-Za-z0-9_.-]+)(?P=q)(?P<sep>\s*[:=]\s*)"
    r"(?P<vq>[\"'])?(?P<value>(?(vq)[^\"'\r\n]*|[^\s\"',;&}\]]+))"
)
_SCHEME_WORD = re.compile(r"(?i)^\s*(?:bearer|basic|token|digest|apikey|key)\s+(\S+)")


def is_secret_name(name: str) -> bool:
    """True for header / attribute names that hold credentials (``x-api-key``, ``http.cookie``)."""
    low = name.lower()
    return low in SECRET_HEADERS or _SECRET_NAME.search(low) is not None


def is_secret_query_key(key: str) -> bool:
    """True for query keys whose values are credentials (``api_key``, ``sig``, ``password``)."""
    low = unquote_plus(key).lower()
    return low in SECRET_QUERY_KEYS or _SECRET_NAME.search(low) is not None


# -- remembered values -------------------------------------------------------------------------
class _Remembered:
    """The secret values this process has sent, longest first (a value inside a longer one
    must not leave the longer one's remainder behind).

    Found with ``str.__contains__`` per value, not one alternation regex: Python's ``re`` tries
    every branch at every position, which made a few hundred values cost milliseconds per text.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, None] = {}  # insertion order = least recently used first
        self.longest_first: tuple[str, ...] = ()

    def add(self, values: Iterable[str]) -> None:
        fresh = [v for v in values if len(v) >= MIN_EXACT]
        if not fresh or all(v in self._values for v in fresh):
            return
        with self._lock:
            for v in fresh:
                self._values.pop(v, None)
                self._values[v] = None
            while len(self._values) > _MAX_REMEMBERED:
                del self._values[next(iter(self._values))]
            self.longest_first = tuple(sorted(self._values, key=len, reverse=True))

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self.longest_first = ()


_REMEMBERED = _Remembered()


def _forms(value: str) -> list[str]:
    """A value as it may be echoed back: as sent, percent-decoded and percent-encoded."""
    return list(dict.fromkeys((value, unquote_plus(value), unquote(value), quote(value, safe=""))))


def remember(values: Iterable[str]) -> None:
    """Treat each value (and its percent-encoded forms) as a secret in all later text."""
    _REMEMBERED.add(form for v in values if v for form in _forms(v))


def forget_all() -> None:
    """Drop every remembered value (tests use it to start clean)."""
    _REMEMBERED.clear()
    _SEEN.clear()


def _header_secrets(name: str, value: str) -> list[str]:
    out = [value.strip()]
    scheme = _SCHEME_WORD.match(value)
    if scheme:
        out.append(scheme.group(1))
    if name.lower() in ("cookie", "set-cookie"):
        for part in value.split(";"):
            out.append(part.partition("=")[2].strip())
    return out


_SEEN: dict[tuple[str, frozenset[tuple[str, str]]], None] = {}
_SEEN_MAX = 64


def remember_request(url: str, headers: Mapping[str, str] | None = None) -> None:
    """Register the secrets a request carries: secret header values, secret query values and
    the URL's userinfo (also in its HTTP Basic form, which aiohttp sends for it).

    A request like one seen recently (a load run sends the same URL and headers every time)
    costs one dictionary lookup.
    """
    seen = (url, frozenset((headers or {}).items()))
    if seen in _SEEN:
        return
    if len(_SEEN) >= _SEEN_MAX:
        _SEEN.clear()
    _SEEN[seen] = None
    values: list[str] = []
    for name, value in (headers or {}).items():
        if is_secret_name(name):
            values += _header_secrets(name, value)
    parts = urlsplit(url)
    for param in parts.query.split("&") if parts.query else ():
        key, sep, value = param.partition("=")
        if sep and is_secret_query_key(key):
            values.append(value)
    if "@" in parts.netloc:
        userinfo = parts.netloc.rsplit("@", 1)[0]
        user, _, password = userinfo.partition(":")
        values += [userinfo, user, password]
        plain = f"{unquote(user)}:{unquote(password)}"
        values.append(base64.b64encode(plain.encode("latin-1", "replace")).decode())
    remember(values)


# -- redaction ---------------------------------------------------------------------------------
def _query_pair(m: re.Match[str]) -> str:
    lead, key, _ = m.groups()
    return f"{lead}{key}={MASK}" if is_secret_query_key(key) else m.group(0)


def _text_pair(m: re.Match[str]) -> str:
    name, q = m["name"], m["q"]
    if not is_secret_name(name) or not m["value"] or m["value"] == MASK:
        return m.group(0)
    # ``word: text`` in prose ("expected a string key: line 1") is not a credential; a
    # header-like name (``X-Api-Key: …``), a quoted name or ``name=value`` is
    header_like = name.lower() in SECRET_HEADERS or "-" in name or "_" in name
    if not q and ":" in m["sep"] and not header_like:
        return m.group(0)
    vq = m["vq"] or ""
    return f"{q}{name}{q}{m['sep']}{vq}{MASK}"


def redact_text(text: str) -> str:
    """``text`` with every credential this module knows of replaced by ``***``."""
    for value in _REMEMBERED.longest_first:
        if value in text:
            text = text.replace(value, MASK)
    # shapes first: ``Authorization: Bearer …`` is one value, not two words
    text = _ANY_SHAPE.sub(MASK, text)
    if "@" in text:
        text = _USERINFO.sub(rf"\1{MASK}@", text)
    if "=" in text:
        text = _QUERY_PAIR.sub(_query_pair, text)
    if "=" in text or ":" in text:
        text = _TEXT_PAIR.sub(_text_pair, text)
    return text


def _redact_param(param: str) -> str:
    key, sep, _ = param.partition("=")
    return f"{key}={MASK}" if sep and is_secret_query_key(key) else param


#: url -> (the remembered values it was redacted with, the result): a load run redacts the same
#: URL for every request. An entry holds its tuple of values, so ``is`` tells it still applies.
_URL_MEMO: dict[str, tuple[tuple[str, ...], str]] = {}
_URL_MEMO_MAX = 256


def redact_url(url: str) -> str:
    """The URL without userinfo and with secret query values replaced by ``***``.

    Other query parameters are kept exactly as written (no re-encoding).
    """
    known = _REMEMBERED.longest_first
    hit = _URL_MEMO.get(url)
    if hit is not None and hit[0] is known:  # no value remembered since: the same result
        return hit[1]
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = "&".join(_redact_param(p) for p in parts.query.split("&")) if parts.query else ""
    out = redact_text(urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)))
    if len(_URL_MEMO) >= _URL_MEMO_MAX:
        _URL_MEMO.clear()
    _URL_MEMO[url] = (known, out)
    return out


def redact_headers(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    """Header name → value with secret headers' values replaced and the rest redacted as text."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {k: MASK if is_secret_name(k) else redact_text(v) for k, v in items}


def redact_obj(obj: Any) -> Any:
    """A JSON-ready structure with secret-named keys' values masked and every string redacted."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, Mapping):
        return {
            k: MASK if isinstance(k, str) and is_secret_name(k) and v else redact_obj(v)
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v) for v in obj]
    return obj
