"""The control plane (py-libp2p + trio): discovery, telemetry, election, planning, status."""

import p2ptrain.net  # noqa: F401  (first: py-libp2p loads lean, net/lean_import.py)
