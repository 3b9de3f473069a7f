"""Who is reviewing: a basic-auth login (--web-config-file's basic_auth_users, as /metrics) or a
bearer token (--bearer-token-file), each naming one reviewer.

For `ragpulse review` behind a single sign-on proxy (oauth2-proxy and the like) that passes an
`Authorization: Bearer` header, and for scripts. The token file has one reviewer per line:

    # reviewer  SHA-256 of the token, in hex
    ana         9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
    bo          sha256:60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752

Tokens are long random strings (at least 32 bytes of a generator), so a fast digest keeps them
as safe as bcrypt keeps passwords, and the file never holds a token itself. The file is read
again when it changes (a Kubernetes Secret rotated in place); a file that no longer reads
keeps the last good one and says so in the log. A token names its reviewer exactly as a login
does: the name on every label it saves.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.formats.review import MAX_NAME_CHARS

log = logging.getLogger(__name__)
_LINE = re.compile(r"^(\S+)\s+(?:sha256:)?([0-9a-fA-F]{64})$")
MAX_TOKEN_FILE_BYTES = 1 << 20


class Login(Protocol):
    """Names the reviewer an `Authorization` header logs in, or None."""

    def user(self, header: str | None) -> str | None: ...


def read_token_file(path: Path) -> dict[bytes, str]:
    """{SHA-256 digest: reviewer} of a token file; SettingsError names the file and line."""
    where = f"--bearer-token-file {path}"
    try:
        if path.stat().st_size > MAX_TOKEN_FILE_BYTES:
            raise SettingsError(f"{where}: over {MAX_TOKEN_FILE_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"{where}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise SettingsError(f"{where}: not UTF-8 text") from None
    digests: dict[bytes, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise SettingsError(f"{where}, line {number}: expected 'REVIEWER SHA256_HEX' (the "
                                "token's SHA-256, never the token itself)")
        name, digest = match.group(1), bytes.fromhex(match.group(2))
        if len(name) > MAX_NAME_CHARS:
            raise SettingsError(f"{where}, line {number}: a reviewer name is at most "
                                f"{MAX_NAME_CHARS} characters")
        if digest in digests:
            raise SettingsError(f"{where}, line {number}: the same token as "
                                f"{digests[digest]}'s: each reviewer needs their own")
        digests[digest] = name
    if not digests:
        raise SettingsError(f"{where}: no reviewer in it")
    return digests


class BearerTokens:
    """Checks `Authorization: Bearer` headers against a token file, re-read when it changes."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._digests = read_token_file(path)
        self._stamp = self._stat()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            s = os.stat(self._path)
        except OSError:
            return None
        return (s.st_mtime_ns, s.st_size, s.st_ino)

    def _current(self) -> Mapping[bytes, str]:
        stamp = self._stat()
        with self._lock:
            if stamp is not None and stamp != self._stamp:
                try:
                    self._digests = read_token_file(self._path)
                    log.info("%s changed: %d reviewers", self._path, len(self._digests))
                except SettingsError as exc:
                    log.warning("%s; the reviewers read before stay", exc)
                self._stamp = stamp
            return self._digests

    def user(self, header: str | None) -> str | None:
        if not header or header[:7].lower() != "bearer ":
            return None
        presented = hashlib.sha256(header[7:].strip().encode("utf-8")).digest()
        found = None
        for digest, name in self._current().items():
            if hmac.compare_digest(digest, presented):  # the same time for every entry
                found = name
        return found


class AnyLogin:
    """The first of several logins that names a reviewer (basic auth, bearer tokens)."""

    def __init__(self, *logins: Login) -> None:
        self._logins = logins

    def user(self, header: str | None) -> str | None:
        for login in self._logins:
            name = login.user(header)
            if name is not None:
                return name
        return None
