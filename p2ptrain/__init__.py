"""p2ptrain: peer-to-peer training of foundation models over slow, uneven links.

Layers, top to bottom (imports go down only; tests/test_layering.py enforces it, and
docs/architecture.md draws the tree): ``app`` composes the ``p2ptrain`` command from ``cli`` (the
product's commands) and ``harness`` (local swarms, benchmarks, baselines: it drives the product
from outside, and nothing in the product imports it); ``node`` (the supervisor); ``control``
(trio, py-libp2p) and ``worker`` (torch, hivemind), which never import each other since the two
libraries cannot share a process; ``net`` and ``train``; ``schedule`` (numpy/scipy) and
``testbed`` (the WAN emulator); ``ipc_lines``; ``records`` (every message, validated);
``identity``, ``procs``; ``errors``.
"""

__version__ = "0.1.0"
