"""The Go runtime settings the data plane's p2pd starts with (hivemind passes the worker's
environment on to the daemon it launches), and which of its log lines are routine.

Go's collector runs by default whenever the heap doubles and at least every 2 minutes. In p2pd
one collection took 0.07-0.09 s of CPU at once, in whichever step it fell; on a worker with a
small CPU quota (bench scaleout: 1/8 of a core) that step took 1.6-1.9x the median one. With
GOGC off and a memory limit, the collector runs only as the daemon's memory nears the limit:
far less often, and less CPU in all (a collection's cost is the live heap, not the garbage).
"""

from __future__ import annotations

import logging
import os

# p2pd lives in tens of MiB; the limit bounds its garbage, not its live heap
GO_RUNTIME = {"GOGC": "off", "GOMEMLIMIT": "256MiB"}


def use_for_daemons() -> None:
    """Set GO_RUNTIME in this process's environment, which the daemons it starts inherit."""
    os.environ.update(GO_RUNTIME)


class RoutineDaemonErrors(logging.Filter):
    """p2pd logs, at ERROR, its listener closing under it when the worker stops ("use of closed
    network connection"): every Ctrl-C of a node printed it, as if something had failed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "use of closed network connection" not in record.getMessage()


def quiet_routine_daemon_errors() -> None:
    """Drop p2pd's routine errors from hivemind's log of the daemon's lines."""
    logging.getLogger("hivemind.p2p.p2p_daemon").addFilter(RoutineDaemonErrors())
