"""The control <-> worker IPC wire: one JSON object per line, each a record of
records/messages.py (docs/protocols.md). Stdlib only, so both sides (trio control, threaded
worker) share it."""

from __future__ import annotations

import json
import logging

from p2ptrain.errors import WireError
from p2ptrain.records.messages import Message, message_from_dict

MAX_LINE_BYTES = 1024 * 1024

log = logging.getLogger(__name__)


def encode(message: Message) -> bytes:
    return json.dumps(message.to_dict(), separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> Message | None:
    """The message on one line, or None (logged) if the line holds no valid message."""
    try:
        return message_from_dict(json.loads(line))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and WireError are ValueErrors
        reason = exc if isinstance(exc, WireError) else "not JSON"
        log.warning("ipc: dropping a line: %s", reason)
        return None


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
