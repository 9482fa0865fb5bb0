"""Running a node: the supervisor of one node's control process and worker."""
