"""One attempt at an outer round, message by message (worker/averaging/outer_exchange.py runs
the attempts and their retry): the two shapes its messages take and the checks on what arrives.

- dense (fp16, int8): `reduce_scatter`. Member j reduces shard j: every member sends it that
  slice (PART), j combines the copies (plan weights, finite check, centred clip:
  worker/averaging/robust.py), encodes the result once and sends it to every member
  (REDUCED), and keeps what they decode of it.
- top-k: `gather`. Each member sends its whole payload to every other (SPARSE); every member
  decodes all of them and combines them the same way in the same order.

Each message carries its sender's claims (checksums of what it sent, the anchor's digest);
`checked` holds the result against them (worker/averaging/checks.py). Anything missing, late,
undecodable or refused fails the attempt (AttemptFailed) on every member alike.

Then, in a group of three or more, the members confirm that they combined the same messages
(worker/averaging/outer_confirm.py).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, MutableMapping
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
)
from p2ptrain.worker.averaging.robust import combine_members
from p2ptrain.worker.averaging.round_inbox import RoundInbox
from p2ptrain.worker.averaging.round_pacing import RoundPacer

_Send = tuple[str, wire.RoundHeader, torch.Tensor]  # to whom, what
# a result, the claims it was checked against, and the digest of each message it combined
AttemptCombined = tuple[torch.Tensor, dict[str, dict[str, float]], dict[str, bytes]]
AttemptResult = tuple[torch.Tensor, dict[str, dict[str, float]]]


class RoundLink(Protocol):
    """How a round's messages leave (worker/averaging/outer_link.py: p2pd streams) and arrive."""

    peer_id: str
    inbox: RoundInbox

    def send(
        self, peer: str, header: wire.RoundHeader, payload: torch.Tensor, timeout_s: float
    ) -> Future[None]: ...


@dataclass(frozen=True)
class Attempt:
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


class AttemptFailed(Exception):
    """An attempt that did not give every member the checked result; `heard`: the members
    we heard from (the retry's group)."""

    def __init__(self, problem: str, heard: set[str]) -> None:
        super().__init__(problem)
        self.heard = heard


def send_paced(link: RoundLink, this: Attempt, sends: list[_Send], timeout_s: float) -> None:
    """Each message to its peer, the pacer's gap apart, starting with the member after us:
    each member's k-th send goes to a different peer, so no one receives every member's first
    message at once."""
    ring, me = len(this.members), this.members.index(link.peer_id)
    sends = sorted(sends, key=lambda send: (this.members.index(send[0]) - me) % ring)
    for index, (peer, header, payload) in enumerate(sends):
        if index:
            this.pacer.between_sends()
        link.send(peer, header, payload, timeout_s)


class AttemptShapes:
    """This replica's side of an attempt's messages, for one exchange (its group and codec)."""

    def __init__(
        self,
        link: RoundLink,
        weights: Mapping[str, float],
        codec: str,
        numel: int,
        signs: torch.Tensor,
        topk_fraction: float,
    ) -> None:
        self.link, self.weights, self.codec, self.numel = link, weights, codec, numel
        self.signs, self.fraction = signs, topk_fraction

    def claims(self, sent: torch.Tensor, this: Attempt) -> Checksums:
        mine = checksums(sent, this.step, self.weights[self.link.peer_id], self.signs)
        return replace(mine, params=this.anchor[0], params_norm=this.anchor[1])

    def collect(
        self,
        this: Attempt,
        kind: str,
        index: int,
        deadline: float,
        decode: Callable[[bytes], torch.Tensor],
        into: tuple[dict[str, torch.Tensor], dict[str, Checksums]],
        digests: MutableMapping[str, bytes] | None = None,
    ) -> list[str]:
        """Every other member's message of `kind` (at `index`) until `deadline`: its decoded
        payload and its claims go `into` (parts, contributors), its digest into `digests`;
        the problems, one a member."""
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
            if digests is not None:
                digests[peer] = wire.message_digest(header, payload)
        return problems

    # --- dense: reduce-scatter, then all-gather of the reduced shards ---

    def reduce_scatter(self, this: Attempt, flat: torch.Tensor) -> AttemptCombined:
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
            claims = self.claims(sent, this)
        wait_s = this.join_s + this.transfer_s
        send_paced(
            self.link,
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
        problems = self.collect(
            this,
            wire.PART,
            mine_index,
            time.monotonic() + this.join_s,
            lambda payload: wire.decode_dense(self.codec, payload, end - start),
            (parts, contributors),
        )
        heard = set(parts) - {me}
        with this.pacer.work():
            reduced, notes = self.combine(parts, contributors, end - start)
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
        send_paced(
            self.link, this, [(peer, header, payload_out) for peer in members if peer != me], wait_s
        )
        if problems:
            raise AttemptFailed("; ".join(problems), heard)
        # every reduced shard; a member that sent its part and died is left out of the retry
        shards: list[torch.Tensor] = []
        reducers: set[str] = set()
        combined = {me: wire.message_digest(header, payload_out.numpy().tobytes())}
        said: list[Mapping[str, Checksums]] = [
            contributors
        ]  # each reducer's account of the members' claims
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
            combined[peer] = wire.message_digest(theirs, payload)
            said.append(theirs.contributors)
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
            raise AttemptFailed("; ".join(problems), reducers)
        if (two_faced := wire.claims_disagree(said)) is not None:
            raise AttemptFailed(two_faced, set())  # the member or a reducer lies: no retry
        result, gathered = self.checked(this, torch.cat(shards), claims, contributors, heard)
        return result, gathered, combined

    # --- top-k: every member's payload to every member ---

    def gather(self, this: Attempt, payload: torch.Tensor, sent: torch.Tensor) -> AttemptCombined:
        me = self.link.peer_id
        with this.pacer.work():
            claims = self.claims(sent, this)
        header = wire.RoundHeader(this.key, wire.SPARSE, me, 0, payload.numel(), claims)
        wait_s = this.join_s + this.transfer_s
        send_paced(
            self.link,
            this,
            [(peer, header, payload) for peer in this.members if peer != me],
            wait_s,
        )
        parts: dict[str, torch.Tensor] = {me: sent}
        contributors: dict[str, Checksums] = {me: claims}
        combined = {me: wire.message_digest(header, payload.numpy().tobytes())}
        problems = self.collect(
            this,
            wire.SPARSE,
            0,
            time.monotonic() + wait_s,
            lambda data: codecs.decode_topk(data, self.numel, self.fraction),
            (parts, contributors),
            combined,
        )
        heard = set(parts) - {me}
        if problems:
            raise AttemptFailed("; ".join(problems), heard)
        with this.pacer.work():
            mean, notes = self.combine(parts, contributors, self.numel)
        if notes:
            raise AttemptFailed(f"combining: {'; '.join(notes)}", heard)
        result, gathered = self.checked(this, mean, claims, contributors, heard)
        return result, gathered, combined

    # --- shared ---

    def combine(
        self, parts: Mapping[str, torch.Tensor], claims: Mapping[str, Checksums], numel: int
    ) -> tuple[torch.Tensor, list[str]]:
        # the claims' median, as a hivemind round's reducer takes it (checks.median_claimed_norm)
        norms = [c.norm for c in claims.values()]
        floor = statistics.median(norms) * (numel / max(self.numel, 1)) ** 0.5 if norms else 0.0
        return combine_members(parts, self.weights, self.link.peer_id, floor)

    def checked(
        self,
        this: Attempt,
        result: torch.Tensor,
        claims: Checksums,
        contributors: Mapping[str, Checksums],
        heard: set[str],
    ) -> AttemptResult:
        gathered = wire.as_gather_map(contributors)
        with this.pacer.work():
            problem = check_round(
                result, claims, gathered, COMPRESSED_TOLERANCE, self.weights, signs=self.signs
            )
        if problem:
            raise AttemptFailed(problem, heard)
        return result, gathered
