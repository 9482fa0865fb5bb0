"""A line plot written as a PNG with the standard library only (matplotlib is not installed).

No text rendering: the axes start at zero, and the caller documents the scales and the colours
(docs/benchmarks.md does).
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

Color = tuple[int, int, int]
COLORS: dict[str, Color] = {
    "scheduled": (0, 114, 178),  # blue
    "random": (213, 94, 0),  # vermilion
    "hivemind_dp": (0, 158, 115),  # green
    "ideal": (150, 150, 150),  # grey
}
WIDTH, HEIGHT, MARGIN = 640, 400, 40


def write_line_plot(
    path: Path, series: dict[str, Sequence[tuple[float, float]]], grid_x: float, grid_y: float
) -> None:
    """Plot each series (x, y) points; light grid lines every grid_x / grid_y units."""
    points = [p for s in series.values() for p in s]
    max_x = max((x for x, _ in points), default=1.0) or 1.0
    max_y = max((y for _, y in points), default=1.0) or 1.0
    pixels = bytearray(b"\xff" * (WIDTH * HEIGHT * 3))

    def to_px(x: float, y: float) -> tuple[int, int]:
        px = MARGIN + round(x / max_x * (WIDTH - 2 * MARGIN))
        py = HEIGHT - MARGIN - round(y / max_y * (HEIGHT - 2 * MARGIN))
        return px, py

    def dot(px: int, py: int, color: Color) -> None:
        if 0 <= px < WIDTH and 0 <= py < HEIGHT:
            i = (py * WIDTH + px) * 3
            pixels[i : i + 3] = bytes(color)

    def line(a: tuple[int, int], b: tuple[int, int], color: Color, width: int = 1) -> None:
        steps = max(abs(b[0] - a[0]), abs(b[1] - a[1]), 1)
        for k in range(steps + 1):
            x = a[0] + (b[0] - a[0]) * k // steps
            y = a[1] + (b[1] - a[1]) * k // steps
            for dx in range(width):
                for dy in range(width):
                    dot(x + dx, y + dy, color)

    grey = (225, 225, 225)
    x = grid_x
    while grid_x > 0 and x < max_x:
        line(to_px(x, 0), to_px(x, max_y), grey)
        x += grid_x
    y = grid_y
    while grid_y > 0 and y < max_y:
        line(to_px(0, y), to_px(max_x, y), grey)
        y += grid_y
    line(to_px(0, 0), to_px(max_x, 0), (0, 0, 0))
    line(to_px(0, 0), to_px(0, max_y), (0, 0, 0))
    for name, s in series.items():
        color = COLORS.get(name, (0, 0, 0))
        pts = [to_px(x, y) for x, y in s]
        for a, b in itertools.pairwise(pts):
            line(a, b, color, width=2)
    _write_png(path, pixels)


def _write_png(path: Path, rgb: bytearray) -> None:
    rows = b"".join(
        b"\x00" + bytes(rgb[y * WIDTH * 3 : (y + 1) * WIDTH * 3]) for y in range(HEIGHT)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", WIDTH, HEIGHT, 8, 2, 0, 0, 0)  # 8-bit RGB
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 9))
        + chunk(b"IEND", b"")
    )
