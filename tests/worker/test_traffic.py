"""The worker's data-plane byte counters (worker/traffic.py): totals and per peer, from any
thread, as a MetricsReport carries them."""

from __future__ import annotations

import threading

from p2ptrain.records import LinkBytes, MetricsReport
from p2ptrain.records.fields import MAX_PEERS
from p2ptrain.worker.traffic import Traffic
from tests.records.samples import A, B, metrics_dict


def test_bytes_add_up_per_peer_and_in_total() -> None:
    traffic = Traffic()
    traffic.sent(A, 100)
    traffic.received(A, 40)
    traffic.add({B: (7, 9), A: (1, 2)})
    assert traffic.link_bytes() == {A: LinkBytes(101, 42), B: LinkBytes(7, 9)}
    assert (traffic.bytes_sent, traffic.bytes_received) == (108, 51)


def test_counts_from_many_threads_are_not_lost() -> None:
    traffic = Traffic()

    def count() -> None:
        for _ in range(2000):
            traffic.sent(A, 1)
            traffic.received(B, 2)

    threads = [threading.Thread(target=count) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert traffic.link_bytes() == {A: LinkBytes(8000, 0), B: LinkBytes(0, 16000)}


def test_a_report_carries_the_busiest_links_it_may() -> None:
    traffic = Traffic()
    traffic.add({f"p{i}": (i, 0) for i in range(MAX_PEERS + 5)})
    links = traffic.link_bytes()
    assert len(links) == MAX_PEERS and "p0" not in links and f"p{MAX_PEERS + 4}" in links
    report = MetricsReport.from_dict(
        {**metrics_dict(), "link_bytes": {p: c.to_dict() for p, c in links.items()}}
    )
    assert MetricsReport.from_dict(report.to_dict()).link_bytes == links
