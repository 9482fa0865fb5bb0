"""NAT traversal below the control plane: the relay and its TCP punch (relay.py, relay_client.py),
dial-backs that tell a node whether others can reach it (dialback.py), and the UDP address
observer (nat_probe.py). Their records are in records/ (relay.py, reachability.py), with every
other record of the project: one fuzzed records package. The control process drives them
(control/traversal.py, control/relay_service.py, control/reachability.py)."""

import p2ptrain.net  # noqa: F401  (first: py-libp2p loads lean, net/lean_import.py)
