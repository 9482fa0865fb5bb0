"""An outer round of one stage's group, ours end to end (sync = "diloco", outer_rounds.py).

The group and its weights are the plan's; members are ordered by peer id. The pseudo-gradient
travels in the stage's `outer_compression` (train/codecs.py, worker/averaging/outer_wire.py):

- dense (fp16, int8): a reduce-scatter then an all-gather (member j reduces shard j); each
  member moves about 2 (R − 1) / R of the vector's encoded bytes each way, as a butterfly
  all-reduce does;
- top-k: a sparse gather, each member's payload (top-k with its own error feedback) to every
  other member, combined by all alike.

This module runs a round's attempts and the retry; one attempt's messages, in either shape,
are worker/averaging/outer_attempt.py's.

Every message carries the sender's checksums of what it sent (its decoded vector) and its
anchor's digest; the result is checked against them (worker/averaging/checks.py: a partial or
tampered round fails) and the digests tell whether the members started from the same anchor.
A round whose reducer dropped or clipped a part fails on every member, as hivemind rounds do.
In groups of three or more the members then confirm they combined the same messages (a member
telling groupmates different things fails the round: outer_confirm.py).

Timeouts: a member's message may come up to `join_s` after we started (replicas run their steps
at their own pace); a reduced shard may take `transfer_s` more; a paced first attempt's waits
grow by its window (round_pacing.py, at most join_s / 2; alike on every member). A member
missing then fails the attempt on everyone; the second, shorter attempt runs among the members
we heard from, so a dead member costs the others at most join_s + the window + retry_s.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from p2ptrain.train import codecs
from p2ptrain.worker.averaging import outer_wire as wire
from p2ptrain.worker.averaging.checks import (
    checksums,
    fixed_signs,
    params_digest,
    replicas_diverged,
)
from p2ptrain.worker.averaging.outer_attempt import (
    Attempt,
    AttemptFailed,
    AttemptShapes,
    RoundLink,
)
from p2ptrain.worker.averaging.outer_confirm import confirmed
from p2ptrain.worker.averaging.round_inbox import RoundStopped
from p2ptrain.worker.averaging.round_pacing import RoundPacer
from p2ptrain.worker.averaging.stage_averager import Outcome

log = logging.getLogger(__name__)

DIVERGENCE_TOLERANCE = 1e-2  # anchors differ by ~1e-2 of their norm after one missed round
# our messages (parts, reduced shards, confirmations: paced_sends) are spaced over this share of
# the pacing window (round_pacing.py). Most of a round's CPU follows its messages (the
# transport's and p2pd's work; a quarter less since they share kept streams,
# worker/kept_streams.py), so their spacing is the round's cost a step: at 0.5, with the
# confirmations sent at once, a group of 8 finished in 8 of 15 steps, its last step carrying
# 70-95 ms of that CPU, and bench scaleout's longest diloco step was 1.46-1.80x the median (9 of
# 12 runs over the 1.5 bar); at 0.8, all of them paced, 1.32-1.48 in 7 of 8 runs (2026-12-02,
# docs/benchmarks.md "runs 65-67")
SEND_SHARE = 0.8


def paced_sends(group_size: int) -> int:
    """The sends a member's attempt spaces over SEND_SHARE of its window: parts, then reduced
    shards (a gather uses half of them), then confirmations (groups of 3 or more)."""
    others = group_size - 1
    return 2 * others + (others if group_size >= 3 else 0)


@dataclass(frozen=True)
class ExchangeTimeouts:
    join_s: float  # how late a member's first message may come
    transfer_s: float  # a reduced shard's extra time after that
    retry_s: float  # the second attempt's join time


def inbox_payload_bytes(codec: str, numel: int, fraction: float) -> int:
    """The largest payload a groupmate's message of an exchange of `numel` values carries:
    top-k, a member's whole payload; dense, one shard (PART, REDUCED) of the smallest group an
    attempt can have, two members (a retry runs among the members heard from). The whole
    vector's bytes let a groupmate park R times more than a round needs, 8 messages of it."""
    if codec == "topk":
        return wire.max_message_bytes(codec, numel, fraction)
    return wire.dense_bytes(codec, -(-numel // 2))


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
        *,
        inner_steps: int,
    ) -> None:
        """inner_steps: the steps between two rounds of this exchange (the run's outer period):
        the inbox reads a groupmate's rounds at most MAX_ROUNDS_AHEAD periods past ours."""
        if len(group) < 2 or link.peer_id not in group:
            raise ValueError(f"an outer round needs >= 2 members, this peer among them: {group}")
        if codec not in codecs.OUTER_CODECS:
            raise ValueError(f"unknown outer codec {codec!r}")
        self.link, self.codec, self.numel = link, codec, numel
        self.weights = dict(group)
        self.prefix, self.timeouts = round_prefix, timeouts
        self.siblings: tuple[str, ...] = ()  # the stage's other fragments' round prefixes
        self.steps_ahead = wire.MAX_ROUNDS_AHEAD * inner_steps
        self.topk = codecs.TopKCompressor(numel, topk_fraction) if codec == "topk" else None
        self._residual_before: torch.Tensor | None = None  # the last round's, until applied
        signs = fixed_signs(numel)
        self.shapes = AttemptShapes(link, self.weights, codec, numel, signs, topk_fraction)
        link.inbox.admit_group(group, inbox_payload_bytes(codec, numel, topk_fraction))
        self._warm_up()

    def _warm_up(self) -> None:
        """A round's first stage-sized buffers cost their page faults too (a first round's prep
        took 0.079 s of CPU against 0.030 s after, one thread): paid here, before step 0."""
        zeros = torch.zeros(self.numel)
        params_digest(zeros, self.shapes.signs)
        checksums(zeros, 0, 1.0, self.shapes.signs)
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
        self._residual_before = None  # the last round's was applied (or put back)
        flat = pseudo_gradient.detach().float().reshape(-1).cpu()
        members = sorted(self.weights)
        sends = paced_sends(len(members))
        window_s = max(0.0, min(spread_s, self.timeouts.join_s / 2))
        pacer = RoundPacer(window_s, SEND_SHARE * window_s / sends, cpu_rate, should_stop)
        at_once = RoundPacer.at_once(should_stop)
        failures: list[str] = []
        self.link.inbox.admit_steps(step + self.steps_ahead)
        try:
            with pacer.work():
                sparse, sent = None, flat
                if self.topk is not None:  # error feedback moves once a round, not an attempt
                    self._residual_before = self.topk.residual.clone()
                    sparse, sent = self.topk.encode(flat)
                anchor_claims = params_digest(anchor.reshape(-1).cpu(), self.shapes.signs)
            # the retry, among the members heard from, goes at once
            tries = ((self.timeouts.join_s, pacer), (self.timeouts.retry_s, at_once))
            for attempt, (join_s, paced) in enumerate(tries):
                key = wire.round_key(self.prefix, step, attempt, members)
                this = Attempt(
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
                        shape = functools.partial(self.shapes.gather, this, sparse, sent)
                    else:
                        shape = functools.partial(self.shapes.reduce_scatter, this, flat)
                    mean, gathered = confirmed(self.link, self.weights, this, shape)
                except AttemptFailed as exc:
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
            self.undo_feedback()
            return flat, Outcome("stopped", 1, "stopped during the outer round")
        finally:  # late copies of this step's messages, and earlier steps' stragglers
            keep = wire.kept_after(self.prefix, step, self.siblings, self.steps_ahead)
            self.link.inbox.forget(keep)
        self.undo_feedback()
        return flat, Outcome("local", 1, "; ".join(failures))

    def keep_feedback(self) -> None:
        """The last round was applied: its error feedback stands (the copy kept to put it back
        goes)."""
        self._residual_before = None

    def undo_feedback(self) -> None:
        """The last round is not applied here (failed, stopped, or dropped by the caller): the
        anchor stays, so the next pseudo-gradient holds this round's movement again, and the
        error feedback goes back to before it (kept, it counted that movement twice: ten failed
        rounds left the anchor 3.8x its target's length off once one passed)."""
        if self.topk is not None and self._residual_before is not None:
            self.topk.residual = self._residual_before
        self._residual_before = None
