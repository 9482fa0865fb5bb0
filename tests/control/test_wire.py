import json
import time

import pytest

from p2ptrain import identity
from p2ptrain.control import wire
from p2ptrain.records import LinkReport, PeerRecord, Plan, Telemetry

SEED = bytes(range(32))
OTHER = bytes(range(1, 33))


def record_body() -> dict:
    return {
        "addrs": [f"/ip4/127.0.0.1/tcp/1/p2p/{identity.peer_id_of(SEED)}"],
        "data_addrs": [],
        "role": "control-only",
        "planner_capable": True,
        "version": "0.1.0",
        "hardware": {"cpu_count": 2},
        "compute_gflops": 1.5,
    }


def plan_body(planner: str) -> dict:
    return {
        "term": 1,
        "epoch": 1,
        "planner": planner,
        "stages": 2,
        "pipelines": [["a", "b"], ["c", "d"]],
        "spares": ["e"],
        "data_addrs": {"a": []},
        "cost_s": 1.0,
    }


def test_round_trip():
    data = wire.sign(SEED, "peer", 7, record_body())
    env = wire.decode(data)
    assert (env.kind, env.author, env.seq, env.body) == (
        "peer",
        identity.peer_id_of(SEED),
        7,
        PeerRecord.from_dict(record_body()),
    )


def tamper(data: bytes, **changes) -> bytes:
    obj = json.loads(data)
    obj.update(changes)
    return json.dumps(obj).encode()


@pytest.mark.parametrize(
    ("make", "category"),
    [
        (lambda: b"\xff\xfe not json", "malformed"),
        (lambda: b"[1, 2]", "malformed"),
        (lambda: b"{" + b" " * wire.MAX_ENVELOPE_BYTES + b"}", "oversized"),
        (lambda: tamper(wire.sign(SEED, "peer", 1, record_body()), sig=None), "unsigned"),
        (lambda: tamper(wire.sign(SEED, "peer", 1, record_body()), sig="zz"), "unsigned"),
        # another author's name on our signature
        (
            lambda: tamper(
                wire.sign(SEED, "peer", 1, record_body()), author=identity.peer_id_of(OTHER)
            ),
            "forged",
        ),
        # body changed after signing
        (lambda: tamper(wire.sign(SEED, "claim", 1, {"term": 1}), body={"term": 9}), "forged"),
        (lambda: tamper(wire.sign(SEED, "claim", 1, {"term": 1}), author="QmXyz"), "forged"),
        (lambda: wire.sign(SEED, "claim", 1, {"term": 1}, ts=time.time() - 3600), "stale"),
        (lambda: wire.sign(SEED, "claim", 1, {"term": 1}, ts=time.time() + 3600), "replayed"),
        (lambda: wire.sign(SEED, "claim", 1, {"term": 0}), "malformed"),
        (lambda: wire.sign(SEED, "peer", 1, {**record_body(), "role": "king"}), "malformed"),
        (lambda: tamper(wire.sign(SEED, "claim", 1, {"term": 1}), kind="nope"), "malformed"),
        (lambda: tamper(wire.sign(SEED, "claim", 1, {"term": 1}), extra=1), "malformed"),
    ],
)
def test_bad_messages_are_refused_with_a_category(make, category):
    with pytest.raises(wire.WireError) as info:
        wire.decode(make())
    assert info.value.category == category


def test_plan_schema_rejects_a_peer_used_twice():
    pid = identity.peer_id_of(SEED)
    body = plan_body(pid)
    body["spares"] = ["a"]
    with pytest.raises(wire.WireError, match="more than once"):
        wire.decode(wire.sign(SEED, "plan", 1, body))
    plan = wire.decode(wire.sign(SEED, "plan", 1, plan_body(pid))).body
    assert isinstance(plan, Plan) and plan.stages == 2
    assert wire.decode(wire.encode(SEED, 2, plan)).body == plan  # records round-trip


def test_telemetry_schema():
    ok = {"links": {"abc": {"rtt_ms": 1.0, "rtt_age_s": 0.5}}, "metrics": None}
    assert wire.decode(wire.sign(SEED, "telemetry", 1, ok)).body == Telemetry(
        links={"abc": LinkReport(rtt_ms=1.0, rtt_age_s=0.5)}
    )
    bad = {"links": {"abc": {"rtt_ms": -1.0}}}
    with pytest.raises(wire.WireError, match="rtt_ms"):
        wire.decode(wire.sign(SEED, "telemetry", 1, bad))


def test_encode_refuses_oversized_bodies():
    with pytest.raises(wire.WireError, match="oversized"):
        wire.sign(SEED, "telemetry", 1, {"links": {"x" * 10: {"pad": "y" * 70_000}}})


@pytest.mark.parametrize(
    "envelope",
    [
        b"[" * 60_000,  # nesting deeper than the parser's recursion
        b'{"v": 1, "ts": 1' + b"0" * 400 + b"}",  # an integer no float holds
        b'{"v":1,"sig":"00","kind":"claim","ts":' + b"9" * 5000 + b"}",  # past int parsing
    ],
)
def test_hostile_bytes_give_the_wire_error(envelope):
    with pytest.raises(wire.WireError):
        wire.decode(envelope[: wire.MAX_ENVELOPE_BYTES])


def test_a_signed_body_with_nan_is_malformed_not_a_crash():
    data = wire.sign(SEED, "claim", 1, {"term": 1}).replace(b'"term":1', b'"term":NaN')
    with pytest.raises(wire.WireError, match="malformed"):
        wire.decode(data)


def test_seq_clock_is_strictly_increasing():
    clock = wire.SeqClock()
    values = [clock.next() for _ in range(1000)]
    assert values == sorted(set(values))
    assert wire.SeqClock().next() > values[0]  # a restarted peer keeps counting up


def test_a_body_decoder_that_slips_is_still_the_wire_error(monkeypatch):
    """The backstop behind every decoder: gossip and sync catch WireError only, so whatever a
    body's decoder raises must reach them as one."""

    def slips(body: object) -> PeerRecord:
        raise TypeError("a slip")

    monkeypatch.setitem(wire.BODY_RECORDS, "peer", slips)
    with pytest.raises(wire.WireError, match=r"^malformed peer"):
        wire.decode(wire.sign(SEED, "peer", 7, record_body()))
