"""An outer round of one stage's group, ours end to end (sync = "diloco", outer_rounds.py).

The group and its weights are the plan's; members are ordered by peer id. The pseudo-gradient
travels in the stage's `outer_compression` (train/codecs.py, worker/averaging/outer_wire.py):

- dense (fp16, int8): a reduce-scatter then an all-gather. Member j reduces shard j: every
  member sends it that slice (PART), j combines the copies with robust_mean (plan weights,
  finite check, centred clip: worker/averaging/robust.py), encodes the result once and sends it
  to every member (REDUCED), and keeps what they decode of it. Each member moves about
  2 (R − 1) / R of the vector's encoded bytes each way, as a butterfly all-reduce does.
- top-k: a sparse gather. Each member sends its whole payload (top-k with its own error
  feedback) to every other (SPARSE); every member decodes all of them and combines them the same
  way in the same order, so all hold the same result.

Every message carries the sender's checksums of what it sent (its decoded vector) and its
anchor's digest; the result is checked against them (worker/averaging/checks.py: a partial or
tampered round fails) and the digests tell whether the members started from the same anchor.
A round whose reducer dropped or clipped a part fails on every member, as hivemind rounds do.

Timeouts: a member's message may come up to `join_s` after we started (replicas run their steps
at their own pace); a reduced shard may take `transfer_s` more; a paced first attempt's waits
grow by its window (round_pacing.py, at most join_s / 2; alike on every member). A member
missing then fails the attempt on everyone; the second, shorter attempt runs among the members
we heard from, so a dead member costs the others at most join_s + the window + retry_s.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from p2ptrain.errors import WireError
from p2ptrain.train import codecs
from p2ptrain.worker.averaging import outer_wire as wire
from p2ptrain.worker.averaging.checks import (
    COMPRESSED_TOLERANCE,
    Checksums,
    check_round,
    checksums,
    fixed_signs,
    params_digest,
    replicas_diverged,
)
from p2ptrain.worker.averaging.robust import combine_members
from p2ptrain.worker.averaging.round_inbox import RoundInbox, RoundStopped
from p2ptrain.worker.averaging.round_pacing import RoundPacer
from p2ptrain.worker.averaging.stage_averager import Outcome

log = logging.getLogger(__name__)

DIVERGENCE_TOLERANCE = 1e-2  # anchors differ by ~1e-2 of their norm after one missed round
# our sends are spaced over this share of the pacing window (round_pacing.py); the rest is
# for the round's CPU pauses and the groupmates' own pacing
SEND_SHARE = 0.5
_Send = tuple[str, wire.RoundHeader, torch.Tensor]  # to whom, what


class RoundLink(Protocol):
    """How a round's messages leave (worker/averaging/outer_link.py: p2pd streams) and arrive."""

    peer_id: str
    inbox: RoundInbox

    def send(
        self, peer: str, header: wire.RoundHeader, payload: torch.Tensor, timeout_s: float
    ) -> Future[None]: ...


@dataclass(frozen=True)
class ExchangeTimeouts:
    join_s: float  # how late a member's first message may come
    transfer_s: float  # a reduced shard's extra time after that
    retry_s: float  # the second attempt's join time


@dataclass(frozen=True)
class _Attempt:
    """One attempt at a step's round: its messages' key, who takes part, how late their first
    messages may come, the anchor every member's claims carry, how our work is paced."""

    key: str
    members: list[str]  # sorted: member j reduces shard j
    step: int
    join_s: float
    transfer_s: float
    anchor: tuple[float, float]  # the anchor's digest and norm (checks.params_digest)
    should_stop: Callable[[], bool]
    pacer: RoundPacer


class _Failed(Exception):
    def __init__(self, problem: str, heard: set[str]) -> None:
        super().__init__(problem)
        self.heard = heard


class OuterExchange:
    """One replica's side of its stage's outer rounds."""

    def __init__(
        self,
        link: RoundLink,
        group: Mapping[str, float],
        codec: str,
        numel: int,
        round_prefix: str,
        timeouts: ExchangeTimeouts,
        topk_fraction: float = 0.03,
    ) -> None:
        if len(group) < 2 or link.peer_id not in group:
            raise ValueError(f"an outer round needs >= 2 members, this peer among them: {group}")
        if codec not in codecs.OUTER_CODECS:
            raise ValueError(f"unknown outer codec {codec!r}")
        self.link, self.codec, self.numel = link, codec, numel
        self.weights = dict(group)
        self.prefix, self.timeouts = round_prefix, timeouts
        self.siblings: tuple[str, ...] = ()  # the stage's other fragments' round prefixes
        self.fraction = topk_fraction
        self.topk = codecs.TopKCompressor(numel, topk_fraction) if codec == "topk" else None
        self._signs = fixed_signs(numel)
        link.inbox.admit_group(group, wire.max_message_bytes(codec, numel, topk_fraction))
        self._warm_up()

    def _warm_up(self) -> None:
        """A round's first stage-sized buffers cost their page faults too (a first round's prep
        took 0.079 s of CPU against 0.030 s after, one thread): paid here, before step 0."""
        zeros = torch.zeros(self.numel)
        params_digest(zeros, self._signs)
        checksums(zeros, 0, 1.0, self._signs)
        if self.codec != "topk":
            wire.decode_dense(self.codec, wire.encode_dense(self.codec, zeros), self.numel)

    def run(
        self,
        pseudo_gradient: torch.Tensor,
        step: int,
        should_stop: Callable[[], bool],
        anchor: torch.Tensor,
        spread_s: float = 0.0,
        cpu_rate: float = 0.0,
    ) -> tuple[torch.Tensor, Outcome]:
        """The group's combined pseudo-gradient, or this replica's own ('local': the round
        failed; 'stopped': should_stop() turned true).

        spread_s: how long the first attempt may spread its work over (outer_rounds.py: the
        passes share the worker's CPU with it), capped well within the timeouts; cpu_rate:
        the CPU seconds a second our thread may use meanwhile (round_pacing.py; 0: no limit)."""
        flat = pseudo_gradient.detach().float().reshape(-1).cpu()
        members = sorted(self.weights)
        sends = 2 * (len(members) - 1)  # parts, then reduced shards (a gather: half of it)
        window_s = max(0.0, min(spread_s, self.timeouts.join_s / 2))
        pacer = RoundPacer(window_s, SEND_SHARE * window_s / sends, cpu_rate, should_stop)
        at_once = RoundPacer.at_once(should_stop)
        failures: list[str] = []
        try:
            with pacer.work():
                sparse, sent = None, flat
                if self.topk is not None:  # error feedback moves once a round, not an attempt
                    sparse, sent = self.topk.encode(flat)
                anchor_claims = params_digest(anchor.reshape(-1).cpu(), self._signs)
            # the retry, among the members heard from, goes at once
            tries = ((self.timeouts.join_s, pacer), (self.timeouts.retry_s, at_once))
            for attempt, (join_s, paced) in enumerate(tries):
                key = wire.round_key(self.prefix, step, attempt, members)
                this = _Attempt(
                    key,
                    members,
                    step,
                    join_s + paced.window_s,
                    self.timeouts.transfer_s + paced.window_s,
                    anchor_claims,
                    should_stop,
                    paced,
                )
                try:
                    if sparse is not None:
                        mean, gathered = self._gather(this, sparse, sent)
                    else:
                        mean, gathered = self._reduce_scatter(this, flat)
                except _Failed as exc:
                    failures.append(f"attempt {attempt + 1}: {exc}")
                    log.warning("step %d outer round attempt %d failed: %s", step, attempt + 1, exc)
                    members = sorted(exc.heard | {self.link.peer_id})
                    if len(members) < 2:
                        break
                    continue
                diverged = replicas_diverged(gathered, DIVERGENCE_TOLERANCE)
                detail = "; ".join(failures)
                return mean, Outcome("averaged", len(gathered), detail, diverged)
        except RoundStopped:
            return flat, Outcome("stopped", 1, "stopped during the outer round")
        finally:  # late copies of this step's messages, and earlier steps' stragglers
            self.link.inbox.forget(wire.kept_after(self.prefix, step, self.siblings))
        return flat, Outcome("local", 1, "; ".join(failures))

    def _claims(self, sent: torch.Tensor, this: _Attempt) -> Checksums:
        mine = checksums(sent, this.step, self.weights[self.link.peer_id], self._signs)
        return replace(mine, params=this.anchor[0], params_norm=this.anchor[1])

    def _collect(
        self,
        this: _Attempt,
        kind: str,
        index: int,
        deadline: float,
        decode: Callable[[bytes], torch.Tensor],
        into: tuple[dict[str, torch.Tensor], dict[str, Checksums]],
    ) -> list[str]:
        """Every other member's message of `kind` (at `index`) until `deadline`: its decoded
        payload and its claims go `into` (parts, contributors); the problems, one a member."""
        parts, contributors = into
        what = {wire.PART: "part", wire.SPARSE: "payload"}.get(kind, kind)
        problems: list[str] = []
        for peer in this.members:
            if peer == self.link.peer_id:
                continue
            got = self.link.inbox.take(this.key, kind, peer, index, deadline, this.should_stop)
            if got is None:
                problems.append(f"no {what} from {peer}")
                continue
            header, payload = got
            try:
                with this.pacer.work():
                    parts[peer] = decode(payload)
            except WireError as exc:
                problems.append(f"{peer}'s {what}: {exc}")
                continue
            contributors[peer] = header.claims
        return problems

    # --- dense: reduce-scatter, then all-gather of the reduced shards ---

    def _reduce_scatter(
        self, this: _Attempt, flat: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, dict[str, float]]]:
        me, key, members = self.link.peer_id, this.key, this.members
        bounds = wire.shard_bounds(self.numel, len(members))
        mine_index = members.index(me)
        encoded: list[torch.Tensor] = []
        decoded: list[torch.Tensor] = []
        for a, b in bounds:  # a shard a piece: the round's first CPU is paced as the rest is
            with this.pacer.work():
                encoded.append(wire.encode_dense(self.codec, flat[a:b]))
                decoded.append(wire.decode_dense(self.codec, encoded[-1], b - a))
        sent = torch.cat(decoded)
        with this.pacer.work():
            claims = self._claims(sent, this)
        wait_s = this.join_s + this.transfer_s
        self._send_paced(
            this,
            [
                (
                    peer,
                    wire.RoundHeader(key, wire.PART, me, j, encoded[j].numel(), claims),
                    encoded[j],
                )
                for j, peer in enumerate(members)
                if peer != me
            ],
            wait_s,
        )
        # our shard: every member's copy of it
        start, end = bounds[mine_index]
        parts: dict[str, torch.Tensor] = {me: sent[start:end]}
        contributors: dict[str, Checksums] = {me: claims}
        problems = self._collect(
            this,
            wire.PART,
            mine_index,
            time.monotonic() + this.join_s,
            lambda payload: wire.decode_dense(self.codec, payload, end - start),
            (parts, contributors),
        )
        heard = set(parts) - {me}
        with this.pacer.work():
            reduced, notes = self._combine(parts, contributors, end - start)
            payload_out = wire.encode_dense(self.codec, reduced)
            reduced = wire.decode_dense(self.codec, payload_out, end - start)
        header = wire.RoundHeader(
            key,
            wire.REDUCED,
            me,
            mine_index,
            payload_out.numel(),
            claims,
            contributors,
            tuple(notes),
        )
        self._send_paced(
            this, [(peer, header, payload_out) for peer in members if peer != me], wait_s
        )
        if problems:
            raise _Failed("; ".join(problems), heard)
        # every reduced shard; a member that sent its part and died is left out of the retry
        shards: list[torch.Tensor] = []
        reducers: set[str] = set()
        deadline = time.monotonic() + this.transfer_s
        for j, peer in enumerate(members):
            if peer == me:
                shards.append(reduced)
                continue
            got = self.link.inbox.take(key, wire.REDUCED, peer, j, deadline, this.should_stop)
            if got is None:
                problems.append(f"no reduced shard from {peer}")
                continue
            reducers.add(peer)
            theirs, payload = got
            if set(theirs.contributors) != set(contributors):
                problems.append(f"{peer} reduced over {sorted(theirs.contributors)}")
            elif theirs.notes:
                problems.append(f"{peer}'s reducer: {'; '.join(theirs.notes)}")
            else:
                try:
                    with this.pacer.work():
                        shards.append(
                            wire.decode_dense(self.codec, payload, bounds[j][1] - bounds[j][0])
                        )
                except WireError as exc:
                    problems.append(f"{peer}'s reduced shard: {exc}")
        if notes:
            problems.append(f"our reducer: {'; '.join(notes)}")
        if problems:
            raise _Failed("; ".join(problems), reducers)
        return self._checked(this, torch.cat(shards), claims, contributors, heard)

    # --- top-k: every member's payload to every member ---

    def _gather(
        self, this: _Attempt, payload: torch.Tensor, sent: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, dict[str, float]]]:
        me = self.link.peer_id
        with this.pacer.work():
            claims = self._claims(sent, this)
        header = wire.RoundHeader(this.key, wire.SPARSE, me, 0, payload.numel(), claims)
        wait_s = this.join_s + this.transfer_s
        self._send_paced(
            this, [(peer, header, payload) for peer in this.members if peer != me], wait_s
        )
        parts: dict[str, torch.Tensor] = {me: sent}
        contributors: dict[str, Checksums] = {me: claims}
        problems = self._collect(
            this,
            wire.SPARSE,
            0,
            time.monotonic() + wait_s,
            lambda data: codecs.decode_topk(data, self.numel, self.fraction),
            (parts, contributors),
        )
        heard = set(parts) - {me}
        if problems:
            raise _Failed("; ".join(problems), heard)
        with this.pacer.work():
            mean, notes = self._combine(parts, contributors, self.numel)
        if notes:
            raise _Failed(f"combining: {'; '.join(notes)}", heard)
        return self._checked(this, mean, claims, contributors, heard)

    # --- shared ---

    def _send_paced(self, this: _Attempt, sends: list[_Send], timeout_s: float) -> None:
        """Each message to its peer, the pacer's gap apart, starting with the member after
        us: each member's k-th send goes to a different peer, so no one receives every
        member's first message at once."""
        ring, me = len(this.members), this.members.index(self.link.peer_id)
        sends = sorted(sends, key=lambda send: (this.members.index(send[0]) - me) % ring)
        for index, (peer, header, payload) in enumerate(sends):
            if index:
                this.pacer.between_sends()
            self.link.send(peer, header, payload, timeout_s)

    def _combine(
        self, parts: Mapping[str, torch.Tensor], claims: Mapping[str, Checksums], numel: int
    ) -> tuple[torch.Tensor, list[str]]:
        norms = [c.norm for c in claims.values()]
        floor = statistics.median(norms) * (numel / max(self.numel, 1)) ** 0.5 if norms else 0.0
        return combine_members(parts, self.weights, self.link.peer_id, floor)

    def _checked(
        self,
        this: _Attempt,
        result: torch.Tensor,
        claims: Checksums,
        contributors: Mapping[str, Checksums],
        heard: set[str],
    ) -> tuple[torch.Tensor, dict[str, dict[str, float]]]:
        gathered = wire.as_gather_map(contributors)
        with this.pacer.work():
            problem = check_round(
                result, claims, gathered, COMPRESSED_TOLERANCE, self.weights, signs=self._signs
            )
        if problem:
            raise _Failed(problem, heard)
        return result, gathered
