"""Run one coroutine function under trio and return its result (the net tests' driver)."""

from __future__ import annotations

from typing import Any

import trio


def run(fn: Any) -> Any:
    result: list[Any] = []

    async def main() -> None:
        result.append(await fn())

    trio.run(main)
    return result[0]
