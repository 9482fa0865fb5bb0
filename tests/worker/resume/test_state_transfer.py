"""Bounds of stage-state transfer (worker/resume/state_transfer.py): the size a stage's state can have,
the deadline, and the client refusing an oversized offer, bytes of another digest, or a state
that would be unpickled (docs/security.md, 26.7)."""

from __future__ import annotations

import asyncio
import builtins
import functools
import hashlib
import struct
from pathlib import Path
from typing import Any

import pytest
import safetensors
import torch

from p2ptrain.errors import WireError
from p2ptrain.records import NetworkFacts, RunSpec
from p2ptrain.train import checkpoint_read, state_file
from p2ptrain.train.checkpoint import record_step, save_stage
from p2ptrain.train.checkpoint_folder import list_states
from p2ptrain.train.model import build_stage, loss_fn
from p2ptrain.train.optim import make_optimizer
from p2ptrain.train.snapshot import StageSnapshot
from p2ptrain.train.state_bounds import expected_state_bytes, expected_state_tensors
from p2ptrain.train.state_digest import file_sha256
from p2ptrain.worker.resume.state_fetch import receive_state
from p2ptrain.worker.resume.state_request import REQUEST_LEN, read_request
from p2ptrain.worker.resume.state_transfer import (
    FOUND,
    MAX_TRANSFER_RTT_S,
    MAX_TRANSFER_S,
    MIN_TRANSFER_RATE_MBPS,
    SIZE,
    StateServer,
    transfer_deadline_s,
)

SPEC = RunSpec().replace(n_layer=2, n_head=2, n_embd=16, block_size=8, steps=10)


def _reply(body: bytes, claimed: int | None = None) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(FOUND + SIZE.pack(len(body) if claimed is None else claimed) + body)
    reader.feed_eof()
    return reader


def _receive(
    body: bytes,
    digest: str,
    max_bytes: int,
    target: Path,
    claimed: int | None = None,
    max_tensors: int | None = None,
) -> None:
    async def run() -> None:
        reply = _reply(body, claimed)
        await receive_state(reply, target, digest, max_bytes, "test", max_tensors=max_tensors)

    asyncio.run(run())


def test_the_expected_size_bounds_a_real_state_of_the_stage(tmp_path: Path) -> None:
    for stage in (0, 1):
        model = build_stage(SPEC, stage, 2)
        optimizer = make_optimizer(model, SPEC)
        x = torch.randint(0, SPEC.model.vocab_size, (2, 8)) if stage == 0 else torch.randn(2, 8, 16)
        out = model(x)
        loss = loss_fn(out, torch.zeros(2, 8, dtype=torch.long)) if stage == 1 else out.sum()
        loss.backward()
        optimizer.step()  # the moments exist
        record_step(tmp_path, SPEC, model, StageSnapshot.take(model, optimizer, 1))
        size = next(tmp_path.glob(f"stage-L{model.layers.start}-*.step1.pt")).stat().st_size
        expected = expected_state_bytes(SPEC, model.layers)
        assert size <= expected < size + 8 * 1024**2


def test_a_fetched_header_past_the_stages_tensors_is_refused_unparsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A holder's file within the size bound but with a header far longer than the stage's
    tensors need (`{},` by the megabyte: GBs once parsed) is refused before json.loads."""
    max_tensors = expected_state_tensors(SPEC, range(0, 1))
    limit = state_file.max_header_bytes(max_tensors)
    header = b"[" + b"{}," * ((limit + 64) // 3) + b"{}]"
    body = struct.pack("<Q", len(header)) + header

    def no_parsing(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an oversized header was parsed")

    monkeypatch.setattr(state_file.json, "loads", no_parsing)
    target = tmp_path / "stage-L0-1.step1.pt"
    digest = hashlib.sha256(body).hexdigest()
    with pytest.raises(WireError, match="oversized stage state"):
        _receive(body, digest, len(body), target, max_tensors=max_tensors)
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_the_expected_tensors_bound_real_states_of_either_sync(tmp_path: Path) -> None:
    for spec in (SPEC, SPEC.replace(sync="diloco")):
        model = build_stage(spec, 0, 2)
        optimizer = make_optimizer(model, spec)
        model(torch.randint(0, spec.model.vocab_size, (2, 8))).sum().backward()
        optimizer.step()  # the moments exist
        path = tmp_path / spec.optim.sync / "state.pt"
        path.parent.mkdir()
        save_stage(path, spec, model, optimizer, 1)
        with safetensors.safe_open(str(path), "pt") as opened:
            assert len(opened.keys()) <= expected_state_tensors(spec, model.layers)
        state_file.check(path, expected_state_tensors(spec, model.layers))


def test_the_deadline_grows_with_the_size_and_the_slowness_of_the_plan() -> None:
    slow = NetworkFacts(max_rtt_s=0.3, min_rate_mbps=10.0)
    fast = NetworkFacts(max_rtt_s=0.01, min_rate_mbps=1000.0)
    assert transfer_deadline_s(10**9, slow) > transfer_deadline_s(10**9, fast)
    assert transfer_deadline_s(10**9, slow) > transfer_deadline_s(10**6, slow)
    assert transfer_deadline_s(10**9, slow) >= 2 * 10**9 * 8 / 10e6  # twice the time at rate


def test_the_deadline_is_bounded_whatever_a_members_links_say() -> None:
    """A plan's slowest link is whatever one member's reports made it: at 1 kbit/s a 100 MB
    state got ~18 days, a stream slot and a fetch held all along. Its links count at 1 Mbit/s
    and 5 s at worst, so it gets what a slow volunteer's uplink needs, and no more."""
    crawl = NetworkFacts(max_rtt_s=600.0, min_rate_mbps=1e-3)
    at_floor = 10.0 + 4 * MAX_TRANSFER_RTT_S + 2 * 10**8 * 8 / (MIN_TRANSFER_RATE_MBPS * 1e6)
    assert transfer_deadline_s(10**8, crawl) == pytest.approx(at_floor)  # ~27 min, not 18 days
    assert transfer_deadline_s(10**8, NetworkFacts(600.0, 1e-6)) == pytest.approx(at_floor)
    assert transfer_deadline_s(10**8, crawl.swarm) == pytest.approx(at_floor)  # one link alike
    # an honest large state on a real link still gets what it needs (10 GB at 20 Mbit/s: 2.2 h)
    assert transfer_deadline_s(10**10, NetworkFacts(0.1, 20.0)) >= 2 * 10**10 * 8 / 20e6
    assert transfer_deadline_s(10**12, crawl) == MAX_TRANSFER_S
    assert transfer_deadline_s(10**6, None) < 60  # a LAN's: as before


def _state_bytes(tmp_path: Path) -> bytes:
    model = build_stage(SPEC, 0, 2)
    path = tmp_path / "saved" / "stage-L0-1.step2.pt"
    save_stage(path, SPEC, model, make_optimizer(model, SPEC), 2)
    return path.read_bytes()


def test_a_state_with_the_agreed_digest_is_kept(tmp_path: Path) -> None:
    body = _state_bytes(tmp_path)
    target = tmp_path / "s.pt"
    _receive(body, hashlib.sha256(body).hexdigest(), 10**6, target)
    assert target.read_bytes() == body


def test_bytes_of_the_agreed_digest_that_are_no_state_file_are_not_kept(tmp_path: Path) -> None:
    body = b"state" * 1000
    with pytest.raises(WireError, match="stage state"):
        _receive(body, hashlib.sha256(body).hexdigest(), 10_000, tmp_path / "s.pt")
    assert list(tmp_path.iterdir()) == []


class _Payload:
    """What a lone hostile holder pickles into a state's optimizer part: unpickling it runs
    code (here: writes a marker file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (builtins.exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def test_a_pickled_state_is_refused_by_the_fetch_path_and_never_unpickled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """26.7: a state of the old format (torch.save: the optimizer state a pickle) whose digest
    the plan agreed on (its lone holder announced it) is refused on arrival, before any byte of
    it is unpickled, even with a torch whose `weights_only` is bypassed (CVE-2025-32434)."""
    marker = tmp_path / "marker"
    crafted = tmp_path / "crafted.pt"
    model = build_stage(SPEC, 0, 2)
    torch.save(
        {
            "format": checkpoint_read.PICKLED_OPTIMIZER_FORMAT,
            "run_id": SPEC.run_id,
            "layers": [0, 1],
            "step": 2,
            "weights": torch.zeros(1, dtype=torch.uint8),
            "model_state": model.state_dict(),
            "optimizer_state": _Payload(marker),
        },
        crafted,
    )
    body = crafted.read_bytes()
    # torch < 2.6: the `weights_only` unpickler could be bypassed: as if it were not there
    vulnerable_load = functools.partial(torch.load, weights_only=False)
    monkeypatch.setattr(torch, "load", lambda f, *a, **k: vulnerable_load(f))
    target = tmp_path / "in" / "stage-L0-1.step2.pt"
    with pytest.raises(WireError, match="torch pickle"):
        _receive(body, hashlib.sha256(body).hexdigest(), 10**6, target)
    assert not target.exists() and list(target.parent.iterdir()) == []
    assert not marker.exists()  # never executed
    torch.load(crafted)  # the control: the crafted file does run code when unpickled
    assert marker.read_text() == "ran"


def test_an_offer_over_the_stages_size_is_refused_before_any_byte_is_stored(
    tmp_path: Path,
) -> None:
    """Attack 8: the state-transfer client took up to 16 GiB to disk from any server."""
    body = b"x" * 5000
    target = tmp_path / "s.pt"
    with pytest.raises(ValueError, match="bytes offered"):
        _receive(body, hashlib.sha256(body).hexdigest(), 4096, target)
    # a server claiming 16 GiB
    with pytest.raises(ValueError, match="bytes offered"):
        _receive(b"", hashlib.sha256(b"").hexdigest(), 4096, target, claimed=16 * 1024**3)
    assert list(tmp_path.iterdir()) == []


def test_bytes_of_another_digest_are_refused_and_nothing_is_left(tmp_path: Path) -> None:
    """Attack 4b: a member served a crafted, well-formed state; its server's word was all."""
    crafted = b"crafted" * 100
    target = tmp_path / "s.pt"
    with pytest.raises(ValueError, match="sha256"):
        _receive(crafted, hashlib.sha256(b"the agreed state").hexdigest(), 10_000, target)
    assert list(tmp_path.iterdir()) == []


def test_a_cut_stream_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(asyncio.IncompleteReadError):
        _receive(b"abc", hashlib.sha256(b"abcdef").hexdigest(), 100, tmp_path / "s", claimed=6)
    assert list(tmp_path.iterdir()) == []


def test_a_request_names_the_digest_and_the_server_finds_that_state_of_any_lineage(
    tmp_path: Path,
) -> None:
    """v2: the server serves the state of the layers and step whose sha256 is the requested
    digest, whatever lineage tag its file carries (records/lineage.py)."""
    model = build_stage(SPEC, 0, 2)
    optimizer = make_optimizer(model, SPEC)
    record_step(tmp_path, SPEC, model, StageSnapshot.take(model, optimizer, 3))
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    tagged = "0123456789abcdef-e2"
    record_step(tmp_path, SPEC, model, StageSnapshot.take(model, optimizer, 3), tagged)
    paths = {s.tag: s.path for s in list_states(tmp_path)}
    server = StateServer(None)  # no transport: only the lookup is exercised
    server.spec, server.directory = SPEC, tmp_path

    def ask(body: bytes) -> Path | None:
        async def run() -> Path | None:
            reader = asyncio.StreamReader()
            reader.feed_data(REQUEST_LEN.pack(len(body)) + body)
            reader.feed_eof()
            opened = await server._find(await read_request(reader))
            if opened is None:
                return None
            opened.close()
            return opened.path

        return asyncio.run(run())

    for tag, path in paths.items():
        body = f'{{"layers": "L0-1", "step": 3, "digest": "{file_sha256(path)}"}}'.encode()
        assert ask(body) == path, tag
    assert ask(b'{"layers": "L0-1", "step": 3, "digest": "' + b"0" * 64 + b'"}') is None
    with pytest.raises(WireError, match="missing field"):
        ask(b'{"layers": "L0-1", "step": 3}')  # a v1 request: no digest
    with pytest.raises(WireError, match="layers"):
        ask(b'{"layers": 5, "step": 3, "digest": "' + b"0" * 64 + b'"}')  # a TypeError before
