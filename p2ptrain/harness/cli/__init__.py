"""The harness's subcommands of the `p2ptrain` command (composed in p2ptrain/app.py)."""
