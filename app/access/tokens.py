"""Bearer tokens: read from a setting (comma-separated) or a file (one a line), checked in constant time.

Imports nothing of the app's: app/config.py uses these checks on its fields, so that a bad token
or an unreadable file stops the start-up with one line naming the setting.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, SecretStr
from pydantic_settings import NoDecode

# RFC 6750's b64token: what may follow "Bearer " in an Authorization header.
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")  # whole: fullmatch
MIN_LENGTH = 16
HINT = "e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def split_tokens(text: str) -> list[str]:
    return [token.strip() for token in text.split(",") if token.strip()]


def read_token_file(path: Path) -> list[str]:
    """One token a line; blank lines and lines starting with # are skipped."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def check_tokens(tokens: Iterable[str]) -> list[str]:
    """The tokens, or ValueError naming the problem (never the token itself: it is a secret)."""
    checked = list(tokens)
    for number, token in enumerate(checked, 1):
        if not _TOKEN.fullmatch(token):
            raise ValueError(f"token {number} has characters a Bearer token cannot carry (A-Z a-z 0-9 - . _ ~ + / =)")
        if len(token) < MIN_LENGTH:
            raise ValueError(f"token {number} is shorter than {MIN_LENGTH} characters; use a long random one, {HINT}")
    return checked


def _check_secret(value: SecretStr | None) -> SecretStr | None:
    if value is not None:
        check_tokens(split_tokens(value.get_secret_value()))
    return value


def _check_file(value: Path | None) -> Path | None:
    if value is None:
        return value
    try:
        tokens = read_token_file(value)
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read the token file {value}: {getattr(error, 'strerror', None) or error}") from None
    if not tokens:
        raise ValueError(f"the token file {value} holds no token (one a line)")
    check_tokens(tokens)
    return value


def _split_origins(value: object) -> object:
    """ "https://a.example,https://b.example" (env, flag) → a tuple; anything else is left to pydantic."""
    return tuple(part.strip() for part in value.split(",") if part.strip()) if isinstance(value, str) else value


def load_tokens(secret: SecretStr | None, file: Path | None) -> list[str]:
    """The tokens of a setting and its file together (either may be unset), checked."""
    tokens = split_tokens(secret.get_secret_value()) if secret is not None else []
    if file is not None:
        tokens += read_token_file(file)
    return check_tokens(tokens)


# The types of the settings in app/config.py. SecretStr: a token never shows in a repr or a log.
Tokens = Annotated[SecretStr | None, AfterValidator(_check_secret)]
TokenFile = Annotated[Path | None, AfterValidator(_check_file)]
Origins = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_split_origins)]


class TokenSet:
    """Tokens kept as SHA-256 digests. A candidate is hashed and compared with every digest with
    hmac.compare_digest, with no early exit: the time taken says neither which token matched nor
    how much of one did (equal-length digests also hide the tokens' lengths)."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self._digests = tuple(hashlib.sha256(token.encode()).digest() for token in set(tokens))

    @classmethod
    def load(cls, secret: SecretStr | None, file: Path | None) -> TokenSet:
        """The tokens of a setting and its file together (either may be unset)."""
        return cls(load_tokens(secret, file))

    def __bool__(self) -> bool:
        return bool(self._digests)

    def __len__(self) -> int:
        return len(self._digests)

    def accepts(self, candidate: bytes) -> bool:
        digest = hashlib.sha256(candidate).digest()
        matched = False
        for known in self._digests:
            matched |= hmac.compare_digest(digest, known)
        return matched


def bearer_token(authorization: bytes | str | None) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` value (the scheme is case-insensitive)."""
    if not authorization:
        return None
    raw = authorization.encode() if isinstance(authorization, str) else authorization
    scheme, _, token = raw.strip().partition(b" ")
    token = token.strip()
    return token if scheme.lower() == b"bearer" and token else None
