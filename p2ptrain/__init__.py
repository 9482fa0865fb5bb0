"""p2ptrain: peer-to-peer training of foundation models over slow, uneven links.

Layers (imports go one way only, enforced by tests/test_layering.py):
``schedule`` (pure numpy/scipy) ← ``control`` + ``net`` (trio, py-libp2p) and
``train`` (torch) ← ``worker`` (torch + hivemind) ← ``cli``.
hivemind and py-libp2p cannot share a process, so ``control`` and ``worker`` never import each other.
"""

__version__ = "0.1.0"
