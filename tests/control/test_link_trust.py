"""Issue 26.9: a peer that refuses (or fails) its counterpart's probes does not get its own
claim about the link believed; the planner prices such a link as the worst measured one."""

from __future__ import annotations

from p2ptrain.control.links import DISTRUST_AFTER_FAILURES
from p2ptrain.control.planning.planner import build_matrices
from p2ptrain.records import LinkReport
from tests.control.test_view import ME, A, B, make_view

# A claims a perfect link to us, measured just now, in every row it sends
PERFECT = {"rtt_ms": 0.01, "rtt_age_s": 0.0, "bandwidth_mbps": 1e6, "bandwidth_age_s": 0.0}


def test_a_peer_that_refuses_our_probes_gets_no_link_at_its_own_word() -> None:
    v, feed = make_view()
    for now in (10.0, 11.0):  # our probes of A fail: it refuses them, or cannot prove the bytes
        v.links.record_probe_failure(A, now, "bandwidth")
        v.links.record_probe_failure(A, now, "rtt")
    assert v.accept(feed("telemetry", A, {"links": {ME: PERFECT}}), 11.0) is None
    link = v.links.freshest(11.5)[(A, ME)]
    assert (link.rtt_ms, link.bandwidth_mbps) == (None, None)
    assert link.rtt_failed and link.rate_failed
    # what we gossip says so, for every other view to apply the same rule
    report = v.links.own_row(11.5)[A]
    assert (report.rtt_failures, report.bandwidth_failures) == (2, 2)
    assert LinkReport.from_dict(report.to_dict()) == report
    # a probe that succeeds again clears it: then the pessimistic end counts, as always
    v.links.record_bandwidth(A, 20.0, now=12.0)
    v.record_rtt(A, 30.0, now=12.0)
    link = v.links.freshest(12.0)[(A, ME)]
    assert (link.rtt_ms, link.bandwidth_mbps, link.rate_failed) == (30.0, 20.0, False)


def test_the_failures_one_end_gossips_void_the_other_end_s_claim() -> None:
    v, feed = make_view()  # a third party: A claims a perfect link to B, B cannot probe A
    failing = {"bandwidth_failures": DISTRUST_AFTER_FAILURES, "rtt_failures": 0}
    assert v.accept(feed("telemetry", A, {"links": {B: PERFECT}}), 5.0) is None
    assert v.accept(feed("telemetry", B, {"links": {A: failing}}), 5.0) is None
    link = v.links.freshest(5.0)[(A, B)]
    assert link.rate_failed and link.bandwidth_mbps is None
    assert link.rtt_ms == 0.01 and not link.rtt_failed  # its round trip B did not dispute
    # one failure is a busy moment, not a verdict
    once = {"bandwidth_failures": DISTRUST_AFTER_FAILURES - 1}
    assert v.accept(feed("telemetry", B, {"links": {A: once}}), 6.0) is None
    assert v.links.freshest(6.0)[(A, B)].bandwidth_mbps == 1e6


def test_the_planner_prices_a_failed_link_as_the_worst_measured_one() -> None:
    v, feed = make_view(me=ME, peers=(A, B))
    honest = {"rtt_ms": 40.0, "rtt_age_s": 0.0, "bandwidth_mbps": 50.0, "bandwidth_age_s": 0.0}
    slow = {"rtt_ms": 90.0, "rtt_age_s": 0.0, "bandwidth_mbps": 5.0, "bandwidth_age_s": 0.0}
    failing = {"bandwidth_failures": 3, "rtt_failures": 3}
    assert v.accept(feed("telemetry", A, {"links": {B: PERFECT, ME: honest}}), 1.0) is None
    assert v.accept(feed("telemetry", B, {"links": {A: failing, ME: slow}}), 1.0) is None
    peers = [A, B, ME]
    m = build_matrices(peers, v.links.freshest(1.0))
    a, b = peers.index(A), peers.index(B)
    assert m.bandwidth_gbps[a, b] == 5.0 / 1000  # the worst rate measured, not A's 1e6
    assert m.delay_ms[a, b] == 90.0 / 2  # and the worst round trip


def test_one_members_pessimism_about_its_own_links_prices_no_other_pair() -> None:
    """A failed link is priced as the worst measured one: a member reporting its own links at
    1e5 ms (a pessimistic word wins its own pairs) set that price for an honest pair whose
    probes failed. The worst is judged on each link's optimistic end now."""
    from p2ptrain.control.links import freshest_links

    peers = ["h1", "h2", "h3", "liar"]
    rows = {
        "h1": (
            {
                "h2": LinkReport(None, None, None, None, rtt_failures=3),
                "h3": LinkReport(40.0, 0.5, 100.0, 0.5),
                "liar": LinkReport(40.0, 0.5, 100.0, 0.5),
            },
            0.0,
        ),
        "h2": (
            {"h3": LinkReport(60.0, 0.5, 100.0, 0.5), "liar": LinkReport(40.0, 0.5, 100.0, 0.5)},
            0.0,
        ),
        "h3": ({"liar": LinkReport(40.0, 0.5, 100.0, 0.5)}, 0.0),
        "liar": ({p: LinkReport(1e5, 0.5, 0.001, 0.5) for p in ("h1", "h2", "h3")}, 0.0),
    }
    links = freshest_links(rows, now=0.5)
    assert links[("h1", "liar")].rtt_ms == 1e5  # its own pairs: its pessimistic word stands
    matrices = build_matrices(peers, links)
    assert links[("h1", "h2")].rtt_failed
    assert matrices.delay_ms[0, 1] == 30.0  # the honest worst (60 ms), not 5e4


def test_the_worst_price_counts_planned_peers_links_at_their_relayed_share_only() -> None:
    """worst_measured took every link: one member's slow link to a peer outside the plan set
    the price of the plan's failed pairs, and a failed link was priced above a measured relayed
    one (its rate at full, the relayed one's at its share)."""
    from p2ptrain.control.links import Link
    from p2ptrain.control.planning.planner import RELAYED_RATE_SHARE, worst_measured

    links = {
        ("a", "b"): Link(20.0, 100.0, 1.0),
        ("a", "c"): Link(30.0, 100.0, 1.0),
        ("a", "outsider"): Link(1e5, 0.001, 1.0),
    }
    delay_ms, gbps = worst_measured(links, ["a", "b", "c"], frozenset({("a", "c")}))
    assert delay_ms == 15.0 and gbps == RELAYED_RATE_SHARE * 0.1


def test_a_doubted_members_lone_word_prices_no_failed_link() -> None:
    from p2ptrain.control.estimate.consistency import doubted_links
    from p2ptrain.control.links import Link
    from p2ptrain.control.planning.planner import worst_measured

    lie = Link(1e5, 0.001, 1.0, rtt_by=("m",), rate_by=("m",), rtt_low_ms=1e5, rate_high_mbps=0.001)
    links = doubted_links({("a", "m"): lie, ("a", "b"): Link(20.0, 100.0, 1.0)}, frozenset({"m"}))
    assert worst_measured(links, ["a", "b", "m"]) == (10.0, 0.1)
