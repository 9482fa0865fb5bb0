"""Pull anti-entropy over SYNC_PROTOCOL: every few seconds, fetch a random live peer's latest
signed envelopes and apply those we lack. It heals what gossip lost, even for a node whose mesh
broke. The server answers with what we author and the latest we accepted from each other author
in the buckets where the client's digests differ from ours (control/held.py: a request carries
them, and the asker's id they leave out): two nodes that agree exchange ~1 kB, whatever the
swarm's size. Whom it asks, and how often: control/sync_partners.py.

Replies are paged, never cut: a request names a cursor (JSON `{"cursor": n}`; empty: 0) and, from
a node outside telemetry's audience (control/gossip.py), `"telemetry": false`: then telemetry
is left out. A reply
holds whole envelopes up to SYNC_PAGE_BYTES and the next cursor (null on the last page), and
the client follows at most MAX_SYNC_PAGES pages. Each reply also carries the responder's term
(null until it learnt one): how a fresh node learns the current term from the organiser; and
whether the responder knows the run finished (control/run_end.py): believed of the organiser
only, how a spare that missed the last step's gossip, or a late joiner, learns it.

What one partner may cost us is bounded per round, all its pulls together (SyncRound): pages
(each at most rpc.MAX_REPLY_BYTES, refused unread past it), envelopes, and MAX_UNUSABLE
envelopes (MAX_UNUSABLE_BYTES of them, plans aside) we cannot use; the client yields to the
event loop between a few envelopes. What a server builds for a request (its own messages
signed, the envelopes it selects) is reused for a second (control/recent.py): strangers may
ask, as often as they like.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import time
from typing import Any

import trio
import trio.lowlevel
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from p2ptrain.control import wire
from p2ptrain.control.authored import authored_messages
from p2ptrain.control.held import NUM_BUCKETS
from p2ptrain.control.intake import Intake, latest_key
from p2ptrain.control.membership import record_pace
from p2ptrain.control.recent import Recent
from p2ptrain.control.state import NodeState
from p2ptrain.control.sync_partners import sync_interval_s, sync_sources, term_only_from
from p2ptrain.control.term_learning import learn_term
from p2ptrain.net import rpc
from p2ptrain.net.paging import checked_next, page_of
from p2ptrain.records.fields import json_value
from p2ptrain.records.replies import SyncPage, SyncRequest

log = logging.getLogger(__name__)

SYNC_PROTOCOL = TProtocol("/p2ptrain/sync/1.0.0")
MAX_SYNC_ENVELOPES = 4096
# a page's envelopes as JSON strings (escaping included): one 64 KiB envelope always fits, and a
# page stays well inside rpc.MAX_REPLY_BYTES
SYNC_PAGE_BYTES = 192 * 1024
# a page is read up to rpc.MAX_REPLY_BYTES: one held plan (up to wire.MAX_PLAN_ENVELOPE_BYTES,
# twice that as a JSON string) beside a planner's own on page 0 needs about that much
PULLED_RECORD_MAX_AGE_S = 600.0
# a large plan is re-sent every few minutes at most (publishing.py: MAX_PLAN_REBROADCAST_S)
PULLED_PLAN_MAX_AGE_S = 3 * 600.0  # three re-sends missed
KEYS_PER_REQUEST = 40  # [author, kind] pairs, ~70 bytes each: inside rpc.MAX_REQUEST_BYTES
MAX_SYNC_PAGES = 128  # 24 MiB a round at most, from a peer that pages forever
# envelopes of one round we cannot use (stale, refused, a second of one author and kind): each
# cost a parse and a signature check (~0.1 ms; up to ~1 ms at 64 KiB) and stale ones no blame.
# An honest partner serves a few hundred at most: members' telemetry from after they left
# (served last, KIND_ORDER; held until the dead are forgotten), and to a newcomer that counts
# few members yet, records older than its record pace allows (~220 at 1,024 members, 302 at
# most, simulated). Their bytes are budgeted too: a stale envelope of 64 KiB of `[[],...]` took
# ~7.85 ms to refuse, 1,024 of them ~8 s a round; 2 MiB of them take ~0.25 s (an honest
# partner's stale ones are small, or a former planner's plan or two)
MAX_UNUSABLE = 1024
MAX_UNUSABLE_BYTES = 2 * 1024 * 1024
YIELD_EVERY = 8  # envelopes applied between yields to the loop (a 4 MiB page held it ~1 s)
# one partner's whole sync, every page and named key: a responder answering each page just
# inside the RPC timeout would otherwise hold the round (and the next) for hours
SYNC_PARTNER_DEADLINE_S = 60.0
# records before what depends on them (telemetry and claims need the author's record)
KIND_ORDER = {"run": 0, "revoked": 1, "peer": 2, "claim": 3, "plan": 4, "telemetry": 5}


def decode_pulled(data: bytes, pace: float = 1.0) -> wire.Envelope:
    """A pulled envelope (wire.decode): a peer record may be PULLED_RECORD_MAX_AGE_S old, times
    the swarm's record `pace` (membership.record_pace: members re-sign an unchanged one every
    record_renew_s; it proves its author alive only as of its `ts`), a plan PULLED_PLAN_MAX_AGE_S
    (a large one is re-sent seldom: publishing.plan_resend_s; the view takes no plan older than
    the one it holds), anything else at most 30 s."""
    try:
        return wire.decode(data)
    except wire.WireError as exc:
        if exc.category != "stale":
            raise
        allowed_s = {"peer": PULLED_RECORD_MAX_AGE_S * pace, "plan": PULLED_PLAN_MAX_AGE_S}
        header = wire.verified_header(data, max_age_s=max(allowed_s.values()))  # checked once
        if time.time() - header.ts > allowed_s.get(header.kind, 0.0):
            raise
        return wire.open_body(header)


def read_request(request: bytes) -> SyncRequest:
    """A sync request (empty: the first page, telemetry included)."""
    if not request:
        return SyncRequest(0)
    try:
        return SyncRequest.from_dict(json_value(request, "sync request"))
    except wire.WireError as exc:
        raise wire.WireError(f'{exc} (a sync request is {{"cursor": n}})') from None


@dataclasses.dataclass
class SyncRound:
    """What one partner's sync may still cost us, its every pull together: a hostile partner
    listing 4,096 keys had ~103 named pulls of 4,096 envelopes and 128 pages each."""

    envelopes_left: int = MAX_SYNC_ENVELOPES
    pages_left: int = MAX_SYNC_PAGES
    unusable: int = 0
    unusable_bytes: int = 0
    applied: set[tuple[str, str]] = dataclasses.field(default_factory=set)  # latest_key's
    stopped: str | None = None  # why we read no more from the partner

    def stop(self, why: str) -> None:
        if self.stopped is None:
            self.stopped = why

    def take_page(self) -> bool:
        """Count one more page read; False (the round stops) past MAX_SYNC_PAGES."""
        if self.pages_left == 0:
            self.stop(f"after {MAX_SYNC_PAGES} pages")
            return False
        self.pages_left -= 1
        return True


class PullSync:
    """Both ends of the sync protocol for one node."""

    def __init__(self, state: NodeState, intake: Intake) -> None:
        self.state = state
        self.intake = intake
        self._asking: set[str] = set()  # the peers we are asking for the term right now
        # what respond_sync built lately (control/recent.py): our own messages signed, by what
        # they state; the envelopes a request selects, by the request (its cursor aside)
        self.own_messages = Recent(self._own_messages, size=4)
        self.selections = Recent(self._selection, size=8)

    async def serve_sync(self) -> None:
        """Once joined, sync from a random connected live member (or the bootstrap), forever.
        A question for the term only is not waited on: on a busy machine one can take the
        whole RPC timeout, and the next second's goes out beside it (one per peer at a time)."""
        state = self.state
        await state.joined.wait()
        async with trio.open_nursery() as asking:
            while True:
                live = set(state.view.live_members(time.monotonic())) | {state.view.bootstrap_id}
                connected = (c.to_base58() for c in state.host.get_connected_peers())
                candidates = [p for p in connected if p in live]
                async with trio.open_nursery() as nursery:
                    for source in sync_sources(state.view, candidates):
                        if not term_only_from(state.view, source):
                            nursery.start_soon(self.sync_from, source)
                        elif source not in self._asking:
                            self._asking.add(source)
                            asking.start_soon(self._ask_term, source)
                await trio.sleep(sync_interval_s(state.view) * random.uniform(0.8, 1.2))

    async def _ask_term(self, peer: str) -> None:
        try:
            await self.sync_from(peer)
        finally:
            self._asking.discard(peer)

    async def sync_from(self, peer: str) -> None:
        """Fetch `peer`'s envelopes where we differ, page by page, and apply the ones we lack;
        then those it listed by fingerprint that we lack, by name; blame it for bad ones. All
        within SYNC_PARTNER_DEADLINE_S: what arrived by then is kept."""
        with trio.move_on_after(SYNC_PARTNER_DEADLINE_S) as deadline:
            await self._sync_from(peer)
        if deadline.cancelled_caught:
            log.info("sync from %s cut off after %.0f s", peer, SYNC_PARTNER_DEADLINE_S)

    async def _sync_from(self, peer: str) -> None:
        state = self.state
        term_only = term_only_from(state.view, peer)
        # as of the first page: the cursor indexes what these digests select
        digests = () if term_only else state.latest.digests((state.peer_id, peer))
        asked = SyncRequest(0, state.view.hears_telemetry, term_only, digests, state.peer_id)
        spent = SyncRound()
        listed = await self._pull(peer, asked, spent)
        wanted = tuple(
            (author, kind)
            for author, kind, said in listed
            if author != state.peer_id and state.latest.fingerprint(author, kind) != said
        )[:MAX_SYNC_ENVELOPES]
        for at in range(0, len(wanted), KEYS_PER_REQUEST):  # a request is at most 4 KiB
            if spent.stopped is not None:
                break
            named = wanted[at : at + KEYS_PER_REQUEST]
            await self._pull(peer, SyncRequest(0, state.view.hears_telemetry, keys=named), spent)
        if spent.stopped is not None:
            log.info("sync from %s stopped: %s", peer, spent.stopped)

    async def _pull(
        self, peer: str, asked: SyncRequest, spent: SyncRound
    ) -> list[tuple[str, str, str]]:
        """Apply the pages `asked` names, from its cursor on, while the round lasts; the
        entries page 0 listed."""
        cursor: int | None = asked.cursor
        listed: list[tuple[str, str, str]] = []
        first_page = True
        while cursor is not None and spent.stopped is None and spent.take_page():
            request = json.dumps(dataclasses.replace(asked, cursor=cursor).to_dict()).encode()
            try:
                reply = SyncPage.from_dict(
                    await rpc.call(self.state.host, ID.from_base58(peer), SYNC_PROTOCOL, request)
                )
                cursor = checked_next(reply.next, cursor)
            except Exception as exc:
                log.debug("sync from %s failed: %s", peer, exc)
                return []
            if first_page:
                self._note_first_page(peer, reply)
                listed = list(reply.entries)
                first_page = False
            await self._apply_page(peer, reply.envelopes, spent)
        return listed

    def _note_first_page(self, peer: str, reply: SyncPage) -> None:
        """What a first page tells besides envelopes: the responder's term, the run's end."""
        view = self.state.view
        anchored = view.term_anchored
        learn_term(view, peer, reply.term, time.monotonic())
        if view.term_anchored and not anchored and self.state.role == "bootstrap":
            self.state.publish_soon("record")  # it carries the term (organiser_term)
        if peer == view.bootstrap_id:  # the organiser's word that the run is trained
            view.run_end.note_organiser(view.run, reply.finished)

    async def _apply_page(self, peer: str, envelopes: tuple[object, ...], spent: SyncRound) -> None:
        """Apply one page's envelopes, yielding to the loop every YIELD_EVERY; the round stops
        once `peer` is blocked or sends a non-envelope, or its envelopes, MAX_UNUSABLE or
        MAX_UNUSABLE_BYTES run out (what was applied is kept)."""
        for index, text in enumerate(envelopes):
            if index and index % YIELD_EVERY == 0:
                await trio.lowlevel.checkpoint()  # trio.sleep(0): others may run
            now = time.monotonic()
            if self.state.view.penalties.is_blocked(peer, now) or not isinstance(text, str):
                spent.stop("blocked, or it sent a non-envelope")
                return
            spent.envelopes_left -= 1
            data = text.encode()
            if not self._apply_one(peer, data, spent, now):
                spent.unusable += 1
                if b'"kind":"plan"' not in data:  # a former planner's: honest, and few
                    spent.unusable_bytes += len(data)
            if spent.envelopes_left == 0:
                spent.stop(f"after {MAX_SYNC_ENVELOPES} envelopes")
            elif spent.unusable >= MAX_UNUSABLE:
                spent.stop(f"{MAX_UNUSABLE} envelopes we could not use")
            elif spent.unusable_bytes >= MAX_UNUSABLE_BYTES:
                spent.stop(f"{spent.unusable_bytes} bytes of envelopes we could not use")
            if spent.stopped is not None:
                return

    def _apply_one(self, peer: str, data: bytes, spent: SyncRound, now: float) -> bool:
        """Apply one pulled envelope; False if it is of no use: stale (no blame: an honest
        partner holds envelopes that aged), bad (blamed), refused by the view, or a second
        new one of an author and kind this round (a partner serves the latest of each)."""
        state = self.state
        try:
            env = decode_pulled(data, record_pace(len(state.view.members)))
        except wire.WireError as exc:
            if exc.category != "stale":
                self.intake.reject(peer, exc.category, str(exc), "sync", now)
            return False
        if env.author == state.peer_id or state.view.seqs.knows(env):
            return True  # what gossip brought too: a partner serves it in good faith
        key = latest_key(env)
        if key in spent.applied:
            return False
        applied = self.intake.apply(env, data, peer, "sync", now)
        if applied:  # a refused first copy leaves room for a newer one later in the round
            spent.applied.add(key)
        return applied

    async def respond_sync(self, request: bytes) -> dict[str, Any]:
        """The server side, one page: our own messages (page 0), then the held envelopes the
        request selects (`_selection`), each built at most once a second (control/recent.py)."""
        asked = read_request(request)
        cursor = asked.cursor
        view = self.state.view
        term = view.known_term() if view.term_anchored else None
        if asked.term_only:
            return SyncPage((), None, term, view.finished).to_dict()
        held, listed = self.selections.get(dataclasses.replace(asked, cursor=0))
        # before we joined, what we would sign states a node the swarm does not know yet
        first = cursor == 0 and not asked.keys and self.state.joined.is_set()
        own_key = (asked.telemetry, view.plan_version, view.planner, view.term)
        own = self.own_messages.get(own_key) if first else ()
        page, nxt = page_of(held, cursor, SYNC_PAGE_BYTES)
        entries = listed if cursor == 0 else ()
        return SyncPage(own + tuple(page), nxt, term, view.finished, entries).to_dict()

    def _own_messages(self, key: tuple[bool, int, str | None, int]) -> tuple[str, ...]:
        """Our own messages, signed now: telemetry too if key[0]; the rest of the key names
        what they state that must not wait a second (a new plan, planner or term)."""
        return tuple(d.decode() for d in authored_messages(self.state, key[0]))

    def _selection(self, asked: SyncRequest) -> tuple[list[str], tuple[tuple[str, str, str], ...]]:
        """The held envelopes `asked` selects, in KIND_ORDER (the cursor indexes them), and the
        entries page 0 lists: all of them, or, where the asker sent its digests
        (control/held.py), those of the buckets where we differ, and all telemetry if it is in
        telemetry's audience."""
        latest = self.state.latest
        listed: list[tuple[str, str, str]] = []
        if len(asked.digests) == NUM_BUCKETS:
            ends = (asked.asker, self.state.peer_id)
            chosen, listed = latest.differing(asked.digests, ends)
            if asked.telemetry:
                chosen += [key for key in latest if key[1] == "telemetry"]
        elif asked.keys:  # named after a page listed them
            chosen = [key for key in set(asked.keys) if key in latest]
        else:  # an older peer's request: everything
            chosen = list(latest)
        if not asked.telemetry:  # outside the audience: no telemetry (control/gossip.py)
            chosen = [key for key in chosen if key[1] != "telemetry"]
        keys = sorted(chosen, key=lambda k: (KIND_ORDER[k[1]], k))
        return [latest[key].decode() for key in keys], tuple(listed)
