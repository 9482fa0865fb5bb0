"""p2ptrain: peer-to-peer training of foundation models over slow, uneven links.

Layers (imports go one way only, enforced by tests/test_layering.py):
``schedule`` (pure numpy/scipy) ← ``control`` + ``net`` (trio, py-libp2p) and
``train`` (torch) ← ``worker`` (torch + hivemind) ← ``node``, ``cli``: the product.
``harness`` (local swarms, benchmarks, baselines, the WAN testbed's users) drives the product from
outside; nothing in the product imports it. ``app`` composes the ``p2ptrain`` command from both.
hivemind and py-libp2p cannot share a process, so ``control`` and ``worker`` never import each other.
"""

__version__ = "0.1.0"
