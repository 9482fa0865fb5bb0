"""What a restarted control process needs to rejoin while the bootstrap is down.

The supervisor restarts a control process that died, and the worker reconnects to it and keeps
training. But a control process joins through the bootstrap: the run spec comes from it and
every loop of the node waits for the join. A bootstrap has no supervisor: while it was down
(until its operator restarted it) a member whose control process had crashed neither worked
nor exited, and the members it had been talking to kept hearing it.

So a joined control process keeps, in the node's IPC folder (0700; it lives as long as the
supervisor, and a new node starts without it), the organiser-signed run envelope and the full
addresses of up to MAX_PEERS members it is connected to. A restarted one that cannot reach the
bootstrap after JOIN_ATTEMPTS tries takes the run from that envelope, checked like the
bootstrap's reply (signed by the organiser the operator named), and dials those members;
discovery and sync do the rest, and the bootstrap is reached again whenever it is back.

A new node has kept nothing: its operator names members to join through instead (`join --via
MADDR...`). Every member answers RUN_PROTOCOL with the latest run envelope the organiser signed
that it holds (control/rpcs.py), and the joiner takes it only if the bootstrap's key, the one in
its `--bootstrap` address, signed it, up to MAX_RUN_AGE_S ago: a member can refuse to help, or
hand over an older run of the same organiser (the joiner is then alone in it), not forge one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

from p2ptrain.control import wire
from p2ptrain.control.rpcs import RUN_PROTOCOL
from p2ptrain.control.state import NodeState
from p2ptrain.errors import WireError
from p2ptrain.net import rpc
from p2ptrain.net.host import parse_multiaddr
from p2ptrain.net.resolve import connect_operator_peer
from p2ptrain.records import RunSpec
from p2ptrain.records.replies import RunReply

log = logging.getLogger("p2ptrain.control.discovery")  # a step of the join, as it logs

FILE_NAME = "rejoin.json"
MAX_PEERS = 16
MAX_FILE_BYTES = 1 << 20
JOIN_ATTEMPTS = 3  # tries at the bootstrap (about 1.5 s) before a restart rejoins without it
SAVE_INTERVAL_S = 60.0  # how fresh the peers kept are
MAX_RUN_AGE_S = 30 * 86400.0  # the kept run envelope was signed when we joined: days ago, maybe


@dataclass(frozen=True)
class Rejoin:
    run_envelope: bytes  # the organiser-signed run spec, as the bootstrap sent it
    peers: tuple[str, ...]  # full multiaddrs (with /p2p/) of members we were connected to


def path_beside(ipc_path: str | None) -> Path | None:
    """Where a node keeps its rejoin file: beside its IPC socket (None: a node without one)."""
    return None if ipc_path is None else Path(ipc_path).parent / FILE_NAME


def save(path: Path, rejoin: Rejoin) -> None:
    """Write atomically (a reader never sees half a file); failures are logged, not raised."""
    data = {"run": rejoin.run_envelope.decode(), "peers": list(rejoin.peers[:MAX_PEERS])}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("cannot keep the rejoin file: %s", exc)
        with contextlib.suppress(OSError):
            tmp.unlink()


def load(path: Path, organiser: str | None) -> tuple[RunSpec, Rejoin] | None:
    """The run spec (checked: signed by `organiser`) and what the file holds; None if there is
    none, or it is not a valid one."""
    try:
        with open(path, "rb") as f_in:
            raw = f_in.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise WireError("oversized")
        data = json.loads(raw)
        envelope = str(data["run"]).encode()
        env = wire.decode(envelope, max_age_s=MAX_RUN_AGE_S)
        peers = tuple(p for p in data["peers"] if isinstance(p, str))[:MAX_PEERS]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        if not isinstance(exc, FileNotFoundError):
            log.warning("the rejoin file %s is not usable: %s", path, exc)
        return None
    if not isinstance(env.body, RunSpec) or env.author != organiser:
        log.warning("the rejoin file %s holds no run spec of our organiser", path)
        return None
    return env.body, Rejoin(envelope, peers)


async def from_kept(state: NodeState, path: Path | None, connect_timeout_s: float = 10.0) -> bool:
    """A restarted control process that cannot reach the bootstrap: the run and the members
    this node kept, if any (state.view.run set, the members dialled); True if so."""
    kept = None if path is None else load(path, state.view.bootstrap_id)
    if kept is None:
        return False
    state.view.run, held = kept
    state.run_envelope, peers = held.run_envelope, held.peers
    for addr in peers:
        with contextlib.suppress(Exception), trio.move_on_after(connect_timeout_s):
            await state.host.connect(info_from_p2p_addr(parse_multiaddr(addr, need_peer_id=True)))
    log.warning(
        "rejoined run %s without the bootstrap (unreachable), from what this node kept: %d "
        "member(s) to start from",
        state.view.run.run_id,
        len(peers),
    )
    return True


def keep(state: NodeState, path: Path | None) -> None:
    """Write what a restarted control process rejoins from: the organiser's newest run envelope
    we hold (gossip re-signs it; else the one we joined with, which ages towards MAX_RUN_AGE_S)
    and the full addresses of members we are connected to."""
    run_envelope = state.newest_run_envelope()
    if path is None or run_envelope is None:
        return
    members, peers = state.view.members, []
    for peer_id in state.host.get_connected_peers():
        member = members.get(peer := peer_id.to_base58())
        if member is not None and peer != state.view.bootstrap_id:
            peers += [f"{a.split('/p2p/')[0]}/p2p/{peer}" for a in member.record.addrs[:2]]
    save(path, Rejoin(run_envelope, tuple(peers)))


def checked_run(
    reply: object, organiser: str | None, max_age_s: float = wire.MAX_CLOCK_SKEW_S
) -> tuple[RunSpec, bytes]:
    """The run spec of a RUN_PROTOCOL reply and its envelope, signed by `organiser` at most
    `max_age_s` ago; WireError if it is not one."""
    run_reply = RunReply.from_dict(reply)
    if run_reply.envelope is None:
        raise WireError(f"no run spec sent: {run_reply.error}")
    envelope = run_reply.envelope.encode()
    env = wire.decode(envelope, max_age_s=max_age_s)
    if not isinstance(env.body, RunSpec) or env.author != organiser:
        raise WireError("forged: run spec not signed by the bootstrap")
    return env.body, envelope


async def through_members(
    state: NodeState, via: tuple[PeerInfo, ...], connect_timeout_s: float = 10.0
) -> ID | None:
    """A new node that cannot reach the bootstrap: the run from the first of the members `via`
    (the operator's) that sends one the organiser signed (state.view.run and run_envelope
    set); that member, or None."""
    for info in via:
        try:
            with trio.fail_after(connect_timeout_s):
                await connect_operator_peer(state.host, info)
            reply = await rpc.call(state.host, info.peer_id, RUN_PROTOCOL)
            run, envelope = checked_run(reply, state.view.bootstrap_id, MAX_RUN_AGE_S)
        except Exception as exc:
            log.warning("cannot join through %s: %s", info.peer_id, exc or type(exc))
            continue
        state.view.run, state.run_envelope = run, envelope
        log.warning(
            "joined run %s through member %s: the bootstrap is unreachable",
            run.run_id,
            info.peer_id,
        )
        return info.peer_id
    return None
