"""SHA-256 of a few bytes, for names and fingerprints, without importing ``hashlib``.

``hashlib`` loads OpenSSL when imported, about 6 ms of every command that names the engine
service's socket (its name is a digest of the pool's path). CPython has its own SHA-256 as a
built-in module (``_sha2`` since 3.12, ``_sha256`` before); ``hashlib`` stays the fallback.
"""

from __future__ import annotations

from typing import Any

try:
    from _sha2 import sha256 as _sha256  # type: ignore[import-not-found, unused-ignore]
except ImportError:
    try:
        from _sha256 import sha256 as _sha256  # type: ignore[import-not-found, no-redef, unused-ignore]
    except ImportError:
        from hashlib import sha256 as _sha256  # type: ignore[assignment, unused-ignore]

_new: Any = _sha256


def sha256_hex(data: bytes) -> str:
    """The SHA-256 of ``data``, in hex."""
    return str(_new(data).hexdigest())
