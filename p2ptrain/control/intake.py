"""Verified envelopes into the SwarmView, from gossip and from sync alike: apply, keep or blame.

An envelope the view accepts from another author is kept in NodeState.latest for sync clients
while its author is a member; one it refuses as hostile costs its culprit a penalty
(Penalties.penalise) and a log warning (sampled where the culprit is a remote author: free keys).
Gossip screens a message by its header before its body is parsed (`screen`: the author's rate
for the kind, its admission, its run), and forwards only what the view accepted (`apply`'s
answer): a message the view ignores goes no further than us.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from p2ptrain.control import wire
from p2ptrain.control.drop import Drop
from p2ptrain.control.events import Change
from p2ptrain.control.flood import GossipRates
from p2ptrain.control.membership import DEAD_AFTER_S
from p2ptrain.control.penalties import BLOCK_S, PENALTIES
from p2ptrain.control.state import NodeState
from p2ptrain.control.term_learning import learn_term
from p2ptrain.net.ratelimit import StampWindows
from p2ptrain.records import Claim, PeerRecord, Revocations
from p2ptrain.sampled_log import LOG_ONE_IN, SampledLog

log = logging.getLogger(__name__)

# how old the organiser's record may be for its term to anchor ours: it re-publishes every 6 s,
# and the swarm's term moves by at most MAX_TERM_STEP past it before a fresher copy arrives
ORGANISER_TERM_AGE_S = 10.0

_WATCHED: tuple[Change, ...] = ("plan", "run", "members")  # as _what_tasks_watch's tuple

# refusals on the header alone that every honest node makes alike (the organiser is the same
# everywhere): an honest forwarder refuses such a message and never forwards it, so the peer
# that sent it to us is to blame too. Not a rate: an honest forwarder may have missed some of
# the author's messages that reached us by other paths.
FORWARDER_BLAMED = frozenset({"unauthorised"})
# refusals that rest on what this node happened to hear (a claim it missed): its author is
# blamed only when it delivered the envelope itself. A copy another peer relayed, synced or
# answered a plan pull with may be an honest author's old envelope, replayed to a node that
# never heard the claim it followed; and no one else is to blame for holding it.
SEEN_DEPENDENT = frozenset({"non-planner"})
# Gossip dropped without blame (stale, of another run, from an author the run does not admit or
# whose record is not here) still cost a parse and a signature check, and a fresh key per
# message escapes every author's rate: the peer that delivered them may cause QUIET_DROPS per
# QUIET_WINDOW_S, and each one past that costs it "flooding" (ten more block it). An honest
# forwarder passes on only what it accepted, so we drop its messages only where our clock or
# view differs from its: a message over 30 s in flight (a reconnect replays only ~6 s of a
# topic, py-libp2p's mcache window), a newcomer's telemetry before its record, a token revoked
# a moment ago: a handful in 30 s. Before our records can be here (`_settled`), a forwarder
# relays every member's telemetry and claims we cannot place yet: those are not counted.
QUIET_DROPS = 40
QUIET_WINDOW_S = wire.MAX_CLOCK_SKEW_S
MAX_TRACKED_FORWARDERS = 4096  # the one idle longest is forgotten first
# settled this long after our first synced envelope (a sync is cut off after 60 s, sync.py), or
# after this long without one (a lone organiser: every member re-sends its record every 120 s)
SETTLE_AFTER_SYNC_S = 60.0
SETTLE_UNSYNCED_S = 300.0
# a node that hears gossip this much late, or whose loop stood still lately (the extra it gives
# silences: membership.dead_after_s), finds its whole backlog stale: no forwarder's doing
BEHIND_S = 5.0
_DROPPED = "dropped %s message on %s from %s: %s (penalty %.1f)"
# a remote author's blame is logged the 1st time, then every 100th: each message of a flood
# may be signed by a fresh key, and the log must not grow with it
_DROPPED_AUTHOR = _DROPPED + f"; remote authors blamed: 1 in {LOG_ONE_IN} logged"


class Intake:
    """The one way a decoded envelope reaches the view; `via` names the topic or "sync"."""

    def __init__(
        self, state: NodeState, on_penalty: Callable[[str, float], None] | None = None
    ) -> None:
        """on_penalty(peer, amount): told of every penalty too (GossipSub's peer scoring)."""
        self.state = state
        self._on_penalty = on_penalty
        # blocked peer -> when the block we logged ends; swept once a block's length
        self._blocked_logged: dict[str, float] = {}
        self._next_sweep = float("-inf")
        self.quiet_drops = StampWindows(QUIET_DROPS, QUIET_WINDOW_S, MAX_TRACKED_FORWARDERS)
        self._synced_at: float | None = None  # our first envelope applied from sync
        self._authors_blamed = SampledLog(log, logging.WARNING)  # remote authors blamed
        self.rates = GossipRates()
        # a claim names a plan too large to gossip: (key, who sent it) (control/plan_pull.py)
        self.wants_plan: Callable[[tuple[int, int], str], None] = lambda key, sender: None
        state.view.members.when_forgotten(self._forget_held)

    def screen(self, header: wire.Header, now: float) -> Drop | None:
        """Refuse a gossip message by its verified header, before its body is parsed: past its
        author's rate for the kind (blamed), of another run, from an author the run does not
        admit (a token run: no valid token in the record, or no record yet), or organiser-only
        kinds from anyone else (blamed). Gossip's author is the pubsub message's signer, so
        blaming it is safe."""
        view, author, kind = self.state.view, header.author, header.kind
        if author == self.state.peer_id:
            return None  # our own message, echoed back
        if not self.rates.allow(author, kind, time.time(), header.ts, header.seq):
            return Drop(f"{kind} messages from {author} past their rate", "flooding")
        if (problem := self.run_problem(header.run_id)) is not None:
            return Drop(problem)
        if kind in ("run", "revoked"):
            if author != view.bootstrap_id:
                return Drop(f"{kind} not signed by our bootstrap", "unauthorised")
        elif kind == "peer":
            if not view.authority.admits_record_token(author, header.raw_body.get("token")):
                return Drop(f"{author} holds no token for this run")
        elif author not in view.members:
            return Drop(f"{kind} before the author's peer record")
        return None

    def run_problem(self, run_id: str) -> str | None:
        """Why an envelope signed for run `run_id` is not of our run, or None ("": an older
        peer's envelope, or one written before its author knew the run: taken)."""
        run = self.state.view.run
        if run_id and run is not None and run_id != run.run_id:
            return f"signed for run {run_id!r}, not for ours ({run.run_id!r})"
        return None

    def apply(self, env: wire.Envelope, data: bytes, sender: str, via: str, now: float) -> bool:
        """Feed a verified envelope to the view; keep it for sync if accepted; blame if hostile.
        True: gossip may forward it (accepted, or a copy of one already applied)."""
        if via == "sync" and self._synced_at is None:
            self._synced_at = now
        if (problem := self.run_problem(env.run_id)) is not None:
            log.debug("ignored %s from %s: %s", env.kind, env.author, problem)
            return False
        already_applied = self.state.view.seqs.knows(env)
        # gossip arrives as it is sent; sync hands over the latest envelope it holds, which
        # may be old: it proves its author alive only as of when it was signed
        age_s = time.time() - env.ts
        heard_at = None if via != "sync" else now - min(max(0.0, age_s), wire.MAX_CLOCK_SKEW_S)
        if via != "sync" and env.author != self.state.peer_id:
            self.state.view.members.delivery_lag.note(env.author, age_s, now)
        before = self._what_tasks_watch(env.author, now)
        drop = self.state.view.accept(env, now, heard_at)
        if drop is None:
            self._learn_organiser_term(env, age_s, now)
            if isinstance(env.body, Claim) and env.body.plan is not None:
                self.wants_plan(env.body.plan, sender)  # too large to gossip: pull it
            if env.author != self.state.peer_id:
                self.state.latest[latest_key(env)] = data
            self._notify_changes(before, self._what_tasks_watch(env.author, now))
            return True
        if drop.category is None or (drop.category in SEEN_DEPENDENT and env.author != sender):
            log.debug("ignored %s from %s: %s", env.kind, env.author, drop.reason)
            return already_applied
        if drop.category == "replayed" or env.author == sender:
            self.reject(sender, drop.category, drop.reason, via, now)
        else:
            self._blame_author(env.author, drop.category, drop.reason, via, now)
        return False

    def _forget_held(self, peer: str) -> None:
        """`peer` is no longer a member (forgotten, revoked, not admitted): what we held of it is
        not served any more. The organiser's run spec and revocations stay: a newcomer needs
        them whether the organiser is heard or not."""
        if peer != self.state.view.bootstrap_id:
            self.state.latest.forget_author(peer)

    def _learn_organiser_term(self, env: wire.Envelope, age_s: float, now: float) -> None:
        """The current term from the organiser's own record, if fresh: an older one may name a
        term the swarm has passed, and a node anchored behind it would blame honest claims."""
        view = self.state.view
        if not isinstance(env.body, PeerRecord) or env.body.term is None:
            return
        if env.author == view.bootstrap_id and age_s <= ORGANISER_TERM_AGE_S:
            learn_term(view, env.author, env.body.term, now)

    def _what_tasks_watch(self, author: str, now: float) -> tuple[object, ...]:
        """What the worker link and the election act on, as far as one author's envelope can
        change it: (plan, run, the author's standing as a member, the planner and term)."""
        view = self.state.view
        member = view.members.get(author)
        standing = (
            None
            if member is None
            else (member.record, view.is_healthy(author), view.is_alive(author, now))
        )
        return (
            view.plan_version,
            view.run,
            (standing, view.planner, view.term, view.term_anchored),
        )

    def _notify_changes(self, before: tuple[object, ...], after: tuple[object, ...]) -> None:
        """Wake the tasks that wait for what changed (control/events.py)."""
        for kind, was, now_is in zip(_WATCHED, before, after, strict=True):
            if was != now_is:
                self.state.changes.notify(kind)

    def refuse(self, header: wire.Header, drop: Drop, forwarder: str, via: str, now: float) -> None:
        """A message `screen` refused: blame its author if hostile, and its forwarder where an
        honest one would have refused it too (FORWARDER_BLAMED), else only note it."""
        author, category = header.author, drop.category
        if category is None:
            what = f"{header.kind} from {author}: {drop.reason}"
            self.drop_quietly(forwarder, what, via, now, author)
        elif author == forwarder:
            self.reject(author, category, drop.reason, via, now)
        else:
            if category in FORWARDER_BLAMED:
                self.reject(forwarder, category, f"forwarded {author}'s {drop.reason}", via, now)
            self._blame_author(author, category, drop.reason, via, now)

    def drop_quietly(
        self, forwarder: str, what: str, via: str, now: float, author: str | None = None
    ) -> None:
        """A gossip message dropped without blame: counted against the `forwarder` that
        delivered it, which is blamed ("flooding") past QUIET_DROPS in QUIET_WINDOW_S. A
        message of an `author` we do not know is counted only once `_settled`; one without an
        author (stale: refused before its header was read) always."""
        log.debug("ignored %s on %s: %s", what, via, forwarder)
        if author is not None and author not in self.state.view.members and not self._settled(now):
            return
        members = self.state.view.members
        if author is None and members.dead_after_s(now) - DEAD_AFTER_S > BEHIND_S:
            return  # we are the late one (our loop stood still, or we hear everyone late)
        if not self.quiet_drops.allow(forwarder, now):
            reason = f"past {QUIET_DROPS} dropped messages in {QUIET_WINDOW_S:.0f} s: {what}"
            self.reject(forwarder, "flooding", reason, via, now)

    def _settled(self, now: float) -> bool:
        """Whether the members' records can be here by now (after our first sync, or long
        after our start without one), so that what we refuse for want of one is no view of
        ours still forming."""
        if self._synced_at is not None:
            return now - self._synced_at >= SETTLE_AFTER_SYNC_S
        return now - self.state.view.started_at >= SETTLE_UNSYNCED_S

    def reject(self, peer: str, category: str, reason: str, via: str, now: float) -> None:
        """Penalise `peer` for a bad message and log it (and its blocking, once per block)."""
        score = self._penalise(peer, category, now)
        log.warning(_DROPPED, category, via, peer, reason, score)
        self._log_blocking(peer, now)

    def _blame_author(self, author: str, category: str, reason: str, via: str, now: float) -> None:
        """`reject` for the author of a message another peer sent us: logged 1 time in
        LOG_ONE_IN (a key made afresh for each message of a flood costs nothing)."""
        score = self._penalise(author, category, now)
        self._authors_blamed.event("blamed", _DROPPED_AUTHOR, category, via, author, reason, score)
        self._log_blocking(author, now)

    def _penalise(self, peer: str, category: str, now: float) -> float:
        """Add the category's penalty to `peer`'s score (and GossipSub's); its new score."""
        if self._on_penalty is not None:
            self._on_penalty(peer, PENALTIES[category])
        return self.state.view.penalties.penalise(peer, category, now)

    def _log_blocking(self, peer: str, now: float) -> None:
        """Log `peer`'s blocking, once per block (a block extended past the one logged may be
        logged again)."""
        if now >= self._next_sweep:  # blocks that ran out go, each once: O(1) a call, amortized
            self._blocked_logged = {p: t for p, t in self._blocked_logged.items() if t > now}
            self._next_sweep = now + BLOCK_S
        logged_until = self._blocked_logged.get(peer, float("-inf"))
        if logged_until <= now and self.state.view.penalties.is_blocked(peer, now):
            # our validators drop everything it sends or writes; pubsub's own blacklist is not
            # used: its teardown can crash the pubsub service (py-libp2p 0.8.1)
            log.warning("blocking %s for %.0f s", peer, BLOCK_S)
            self._blocked_logged[peer] = now + BLOCK_S


def latest_key(env: wire.Envelope) -> tuple[str, str]:
    """Where NodeState.latest keeps an accepted envelope: one per author and kind, and one per
    page of the organiser's revocations (each page holds different entries)."""
    body = env.body
    if isinstance(body, Revocations) and body.page > 0:
        return (f"{env.author}/{body.page}", env.kind)
    return (env.author, env.kind)
