"""The control plane (py-libp2p + trio): discovery, telemetry, election, planning, status."""
