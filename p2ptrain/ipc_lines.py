"""The control <-> worker IPC wire: newline-delimited JSON objects with a "type" (contracts in
docs/protocols.md). Stdlib only, so both sides (trio control, threaded worker) share it."""

from __future__ import annotations

import json
import logging
from typing import Any

MAX_LINE_BYTES = 1024 * 1024

log = logging.getLogger(__name__)


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any] | None:
    """The message on one line, or None (logged) if it is not a JSON object with a string type."""
    try:
        message = json.loads(line)
    except ValueError:
        log.warning("ipc: dropping a line that is not JSON")
        return None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        log.warning("ipc: dropping a message without a type")
        return None
    return message


class LineBuffer:
    """Splits a byte stream into lines; a line over MAX_LINE_BYTES is dropped, not buffered."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        if len(self._buffer) > MAX_LINE_BYTES:
            log.warning("ipc: dropping an oversized line (> %d bytes)", MAX_LINE_BYTES)
            self._buffer = b""
        return lines
