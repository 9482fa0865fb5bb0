"""Run by test_outer_round_loopback.py in its own process (hivemind is not imported beside
libp2p): three members, each its own p2pd daemon on 127.0.0.1 with the worker's Transport and
the outer round's link over it, run outer rounds of one stage (int8, then top-k), then a round
in which one member's daemon is shut down after its parts left and before its reduced shard did
(its process died, as far as the network can tell), and one without it. Prints one JSON line: per round and member the outcome, the seconds it
took, a digest of the result, and the bytes each transport counted."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from concurrent.futures import Future
from typing import Any

import torch
from hivemind.p2p import P2P

from p2ptrain.worker.averaging import outer_wire as wire
from p2ptrain.worker.averaging.outer_attempt import RoundLink
from p2ptrain.worker.averaging.outer_exchange import ExchangeTimeouts, OuterExchange
from p2ptrain.worker.averaging.outer_link import P2PRoundLink
from p2ptrain.worker.pipeline.frames import FrameHeader, NotReady
from p2ptrain.worker.pipeline.transport import Transport
from p2ptrain.worker.private_tmp import PrivateTmp

NUMEL = 200_000
TIMEOUTS = ExchangeTimeouts(join_s=4.0, transfer_s=4.0, retry_s=3.0)


def never_ready(header: FrameHeader) -> None:
    raise NotReady()


async def open_p2p() -> P2P:
    return await P2P.create(
        host_maddrs=["/ip4/127.0.0.1/tcp/0"], nat_port_map=False, auto_nat=False
    )


class DyingLink:
    """A member's link whose process dies between the reduce-scatter and the all-gather: its
    daemon is shut down as it is about to send its reduced shard."""

    def __init__(self, link: P2PRoundLink) -> None:
        self.link, self.peer_id, self.inbox = link, link.peer_id, link.inbox

    def send(
        self, peer: str, header: wire.RoundHeader, payload: torch.Tensor, timeout_s: float
    ) -> Future[None]:
        if header.kind == wire.REDUCED:
            self.link.transport.close()
            failed: Future[None] = Future()
            failed.set_exception(ConnectionError("dead"))
            return failed
        return self.link.send(peer, header, payload, timeout_s)


def one_round(exchanges: list[OuterExchange], step: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(step)
    base = torch.randn(NUMEL, generator=gen)
    out: dict[str, Any] = {}

    def member(i: int) -> None:
        grad = base + 0.3 * torch.randn(NUMEL, generator=torch.Generator().manual_seed(step + i))
        started = time.monotonic()
        mean, outcome = exchanges[i].run(grad, step, lambda: False, torch.ones(NUMEL))
        out[exchanges[i].link.peer_id] = {
            "kind": outcome.kind,
            "group_size": outcome.group_size,
            "detail": outcome.detail[:300],
            "took_s": time.monotonic() - started,
            "digest": hashlib.sha256(mean.numpy().tobytes()).hexdigest()[:16],
        }

    threads = [threading.Thread(target=member, args=(i,)) for i in range(len(exchanges))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def count_streams(links: list[P2PRoundLink]) -> tuple[Counter[str], list[str]]:
    """The streams the links open, by protocol, and every message's tries."""
    opened: Counter[str] = Counter()
    tries: list[str] = []
    for link in links:
        transport, open_stream, send_on = link.transport, link.transport.open_stream, link._send_on

        async def counted(peer: str, protocol: str, open_stream: Any = open_stream) -> Any:
            opened[protocol] += 1
            return await open_stream(peer, protocol)

        async def sent(peer: str, *args: Any, send_on: Any = send_on, **kw: Any) -> bytes:
            tries.append(peer)
            return await send_on(peer, *args, **kw)

        transport.open_stream = counted  # type: ignore[method-assign]
        link._send_on = sent  # type: ignore[method-assign]
    return opened, tries


def main() -> None:
    PrivateTmp().use()  # hivemind's sockets and multiprocessing's folders go with us
    transports = [Transport.start(open_p2p, never_ready) for _ in range(3)]
    addrs = {t.peer_id: [str(a) for a in t.call(t.p2p.get_visible_maddrs())] for t in transports}
    for t in transports:
        t.connect_all({p: a for p, a in addrs.items() if p != t.peer_id})
    links = [P2PRoundLink.of(t) for t in transports]
    opened, tries = count_streams(links)
    group = {t.peer_id: 1.0 + i for i, t in enumerate(transports)}
    result: dict[str, Any] = {"members": [t.peer_id for t in transports], "numel": NUMEL}
    for codec in ("fp16", "int8", "topk"):
        exchanges = [
            OuterExchange(k, group, codec, NUMEL, f"run/1/1/0/{codec}", TIMEOUTS, inner_steps=10)
            for k in links
        ]
        before = sum(t.traffic.bytes_sent for t in transports)
        result[codec] = one_round(exchanges, 10)
        result[codec + "_bytes"] = sum(t.traffic.bytes_sent for t in transports) - before
    result["streams_opened"], result["messages_sent"] = dict(opened), len(tries)
    # the third member dies mid-round: after its parts left, before its reduced shard did
    dying: list[RoundLink] = [links[0], links[1], DyingLink(links[2])]
    exchanges = [
        OuterExchange(k, group, "int8", NUMEL, "run/1/1/0/mid", TIMEOUTS, inner_steps=10)
        for k in dying
    ]
    result["killed"] = transports[2].peer_id
    result["killed_mid_round"] = one_round(exchanges, 20)
    # the next round: it is gone from the start
    result["killed_before_round"] = one_round(exchanges[:2], 30)
    result["timeouts"] = [TIMEOUTS.join_s, TIMEOUTS.transfer_s, TIMEOUTS.retry_s]
    print(json.dumps(result), flush=True)
    for t in transports[:2]:
        t.close()


if __name__ == "__main__":
    main()
