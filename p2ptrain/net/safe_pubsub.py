"""py-libp2p 0.8.1's Pubsub, less the ways one peer (or a busy machine) ends a node through it.

- Its reader catches only the library's own stream and parse errors: protobuf's `DecodeError`
  on one garbage frame escaped the handler and ended the host. Any reader failure now resets
  that stream and forgets the peer's pubsub state, as the library does for a parse error.
- A message it accepted for processing runs as a task of the Pubsub service, whose failure ends
  the service: a publish with a garbage public key made `signature_validator` re-raise
  protobuf's `DecodeError`. Such a message is now dropped.
- Several tasks write one peer's stream (the sending loop, the identify-pending flush, the
  replay of recent messages on each subscription), and yamux's `write` takes its lock per frame,
  not per message: once a message spans frames (over 64 KiB, or more than the send window left)
  two messages interleave, and the reader's next length prefix is garbage (tests/net/
  test_safe_pubsub.py reproduces it on two hosts). A write that fails or is cancelled mid-message
  leaves half a message that the next one would follow. Whole messages are now written under one
  lock per stream, and a stream whose write did not complete is reset, so nothing follows half a
  message.
- The reader starts one task per message it reads, and every mesh peer forwards a copy of each
  message: a copy of a message already seen is dropped before a task starts (that task's first
  checks dropped it).
- A peer that never registered (its inbound stream read, our outbound one never opened) was
  forgotten by the library's subscriptions only, not by the router: it stayed in the mesh and
  scorer it got into. Its router state now goes once it is no longer connected.
- The library caches a refused message by its id for 300 s, whoever forwarded it. Our
  validator's refusals depend on the forwarder (a blocked one's copies are refused) and on the
  view (an author whose record is a moment away): a blocked peer relaying honest messages first
  made every later copy, the author's own too, refused from the cache. Refusals are not cached.
"""

from __future__ import annotations

import logging
from typing import Any
from weakref import WeakKeyDictionary

import trio
from libp2p.abc import INetStream
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub, ValidationError

from p2ptrain.net.stream_end import end

log = logging.getLogger(__name__)


class SafePubsub(Pubsub):
    """`Pubsub` whose per-peer failures end only that peer's stream or message."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._write_locks: WeakKeyDictionary[INetStream, trio.Lock] = WeakKeyDictionary()

    async def write_msg(self, stream: INetStream, rpc_msg: rpc_pb2.RPC) -> bool:
        """One whole length-prefixed message at a time per stream; a write that does not
        complete resets the stream."""
        written = False
        async with self._write_locks.setdefault(stream, trio.Lock()):
            try:
                written = await super().write_msg(stream, rpc_msg)
            finally:
                if not written:
                    await _reset(stream)
        return written

    async def stream_handler(self, stream: INetStream) -> None:
        try:
            await super().stream_handler(stream)
        except Exception as exc:
            peer_id = stream.muxed_conn.peer_id
            log.info("pubsub stream of %s reset: %s: %s", peer_id, type(exc).__name__, exc)
            await _reset(stream)
            self._handle_dead_peer(peer_id)

    def _handle_dead_peer(self, peer_id: ID) -> None:
        registered = peer_id in self.peers
        super()._handle_dead_peer(peer_id)
        # the library calls router.remove_peer only for registered peers; one still connected
        # is retried, and the heartbeat drops it from the mesh (net/lazy_gossip.py)
        if not registered and not self._peer_is_connected(peer_id):
            self.router.remove_peer(peer_id)

    async def validate_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        try:
            await super().validate_msg(msg_forwarder, msg)
        except ValidationError:  # the next copy, from another forwarder or later, is judged anew
            self.validation_cache._remove(self._msg_id_constructor(msg))
            raise

    def _is_subscribed_to_msg(self, msg: rpc_pb2.Message) -> bool:
        """The reader's filter before it starts a task per message: a message already seen is
        left out too. That task's first checks would drop it (push_msg), and every mesh peer
        forwards us a copy of each message, so most tasks were started for nothing."""
        return super()._is_subscribed_to_msg(msg) and not self._is_msg_seen(msg)

    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        try:
            await super().push_msg(msg_forwarder, msg)
        except Exception as exc:
            log.info(
                "dropped a message forwarded by %s: %s: %s",
                msg_forwarder,
                type(exc).__name__,
                exc,
            )


async def _reset(stream: INetStream) -> None:
    await end(stream, clean=False)  # a cancelled write still resets its stream
