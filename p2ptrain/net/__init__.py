"""py-libp2p plumbing for the control plane: host factory, framing and the probe/RPC protocols.

Importing this package first leaves py-libp2p's unused transports unloaded (lean_import.py)."""

from p2ptrain.net import lean_import

lean_import.install()
