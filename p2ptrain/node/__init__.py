"""Running nodes: the supervisor of one node (control process + worker), and `local_run`, which
starts a bootstrap and N nodes on this machine (loopback, or the WAN testbed's namespaces)."""
