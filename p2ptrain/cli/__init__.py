"""The ``p2ptrain`` command line: one command, one module per subcommand.

Subcommand modules are imported only when chosen, because the control plane (py-libp2p) and the
worker (hivemind) cannot be imported into one process.
"""
