"""The product's subcommands of ``p2ptrain`` (schedule, bootstrap, join, status), one module each,
and the parser and dispatch (main.py) that p2ptrain/app.py composes them with the harness's.

Subcommand modules are imported only when chosen, because the control plane (py-libp2p) and the
worker (hivemind) cannot be imported into one process.
"""
