"""Job ids (SPEC §3): `<stem>-<YYYYMMDDTHHMMSSZ>-<6 hex>` and UTC timestamps."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    """UTC ISO-8601 with a `Z`."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def new(stem: str, now: datetime) -> str:
    return f"{stem}-{now.astimezone(UTC).strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"
