"""A token: the organiser's signed word that one peer may join a run, and whether it may plan.

The organiser's key is the bootstrap's identity. `p2ptrain token issue` signs a token for a peer
id; the peer passes it to `join --token` and announces it in its peer record, where every node
checks it against the bootstrap it joined through. Authority comes from this signature, never
from what a peer says about itself.

A token names the run it admits to (`run_id`, signed): a node refuses a token of another run, so
one organiser key can run several swarms whose tokens do not open each other. A token without a
run id (issued before run ids were signed, or with no `--run`) is valid in every run of its key.
Revocations are paged: any number of them load from a file, and they travel as Revocations
messages of at most REVOCATIONS_PER_PAGE entries each.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Self

from p2ptrain import identity
from p2ptrain.errors import WireError
from p2ptrain.records import fields as f
from p2ptrain.records.codec import Custom, Int, Nested, Num, PeerId, Record, Seq, Text, Wire
from p2ptrain.records.run import MAX_RUN_ID_CHARS

MAX_TOKEN_CHARS = 1024
TOKEN_PREFIX = "p2pt1."
REVOCATION_PREFIX = "p2prv1."
REVOCATIONS_PER_PAGE = 200  # ~270 bytes each: a page fits one 64 KiB envelope
MAX_REVOCATIONS = REVOCATIONS_PER_PAGE  # the old name: a page's bound, not the list's
MAX_REVOCATION_PAGES = 100_000  # 20 M revocations: a bound for the page fields, not a cap in use


def _signature(value: object, record: str, name: str = "sig") -> str:
    sig = f.text(value, record, name, 128)
    if len(sig) != 128 or not all(c in "0123456789abcdef" for c in sig):
        raise f.malformed(record, "sig must be 64 bytes in lowercase hex")
    return sig


def _to_line(prefix: str, data: dict[str, Any]) -> str:
    """A record as one line of text: the prefix, then base64 of its compact JSON."""
    raw = json.dumps(data, separators=(",", ":")).encode()
    return prefix + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _from_line(prefix: str, text: object, record: str) -> object:
    """The JSON value a line of `_to_line` holds; WireError for any other text."""
    if not isinstance(text, str) or not text.startswith(prefix):
        raise f.malformed(record, f"text that starts with {prefix}")
    if len(text) > MAX_TOKEN_CHARS:
        raise f.malformed(record, "too long")
    body = text[len(prefix) :]
    try:
        return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (ValueError, RecursionError):  # bad base64 (binascii.Error), bad JSON
        raise f.malformed(record, "not base64 of a JSON object") from None


# sent always, though a record is built unsigned first
Signature = Annotated[str, Custom(_signature), Wire(required=True)]


@dataclass(frozen=True)
class _SignedLine(Record):
    """A record the organiser signs that travels as one line of text: PREFIX, then base64 of
    its JSON. The signature covers `signed_body()` as sorted compact JSON."""

    PREFIX: ClassVar[str]

    def signed_body(self) -> dict[str, Any]:
        raise NotImplementedError

    def signed_bytes(self) -> bytes:
        return json.dumps(self.signed_body(), sort_keys=True, separators=(",", ":")).encode()

    def encode(self) -> str:
        """The record as one line of text (what the organiser's commands print)."""
        return _to_line(self.PREFIX, self.to_dict())

    @classmethod
    def decode(cls, text: object) -> Self:
        """A record from its text form; WireError for anything else."""
        return cls.from_dict(_from_line(cls.PREFIX, text, cls.RECORD))


@dataclass(frozen=True)
class Token(_SignedLine, name="token"):
    """Its text form is what `token issue` prints and `join --token` takes."""

    PREFIX: ClassVar[str] = TOKEN_PREFIX
    peer: Annotated[str, PeerId()]  # the holder's peer id
    planner: bool  # may be elected planner and sign plans
    expires_at: Annotated[float, Num(0.0, 1e11)]  # seconds since the epoch
    issuer: Annotated[str, PeerId()]  # the organiser's peer id (the bootstrap's identity)
    sig: Signature = ""  # hex Ed25519 signature of signed_bytes() by the issuer's key
    # the run it admits to ("": every run of the issuer's key)
    run_id: Annotated[str, Text(MAX_RUN_ID_CHARS, empty=True), Wire(omit_default=True)] = ""

    def signed_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "peer": self.peer,
            "planner": self.planner,
            "expires_at": self.expires_at,
            "issuer": self.issuer,
        }
        if self.run_id:  # absent from run-less tokens: their old signatures still verify
            body["run_id"] = self.run_id
        return body


def issue_token(
    organiser_seed: bytes, peer: str, planner: bool, expires_at: float, run_id: str = ""
) -> Token:
    """A token for `peer` in run `run_id` ("": any run of this key), signed with the
    organiser's key."""
    unsigned = Token(
        peer, planner, float(expires_at), identity.peer_id_of(organiser_seed), run_id=run_id
    )
    signature = identity.sign(organiser_seed, unsigned.signed_bytes()).hex()
    return dataclasses.replace(unsigned, sig=signature)


def token_problem(
    token: Token, organiser: str | None, peer: str, now: float, run_id: str | None = None
) -> str | None:
    """Why `token` does not admit `peer` to run `run_id` (None: not known yet, not checked)
    organised by `organiser`, or None."""
    if organiser is None:
        return "the organiser (bootstrap) is not known yet"
    if token.issuer != organiser:
        return f"issued by {token.issuer}, not by the organiser {organiser}"
    if token.peer != peer:
        return f"issued to {token.peer}, not to {peer}"
    if token.run_id and run_id is not None and token.run_id != run_id:
        return f"issued for run {token.run_id!r}, not for run {run_id!r}"
    if token.expires_at < now:
        return "expired"
    key = identity.public_key_of_peer_id(token.issuer)
    if key is None or not identity.verify(key, token.signed_bytes(), bytes.fromhex(token.sig)):
        return "its signature does not verify"
    return None


@dataclass(frozen=True)
class Revocation(_SignedLine, name="revocation"):
    """Its text form is what `token revoke` prints and `bootstrap --revoked` files hold."""

    PREFIX: ClassVar[str] = REVOCATION_PREFIX
    peer: Annotated[str, PeerId()]  # whose tokens no longer count
    issuer: Annotated[str, PeerId()]  # the organiser's peer id
    sig: Signature = ""  # hex Ed25519 signature of signed_bytes() by the issuer's key

    def signed_body(self) -> dict[str, Any]:
        # "revoke" rather than "peer": these bytes can never be a token's signed bytes
        return {"revoke": self.peer, "issuer": self.issuer}


@dataclass(frozen=True)
class Revocations(Record, name="revocations"):
    """One page of the organiser's revocations (envelope kind "revoked"): the list is cut into
    pages of REVOCATIONS_PER_PAGE (revocation_pages); a receiver adds each page's entries."""

    entries: Annotated[tuple[Revocation, ...], Seq(Nested(Revocation), REVOCATIONS_PER_PAGE)]
    # which page of the organiser's list, of num_pages
    page: Annotated[int, Int(0, MAX_REVOCATION_PAGES - 1)] = 0
    num_pages: Annotated[int, Int(1, MAX_REVOCATION_PAGES)] = 1

    def wire_problem(self) -> str | None:
        return None if self.page < self.num_pages else "page must be below num_pages"


def revocation_pages(entries: tuple[Revocation, ...]) -> list[Revocations]:
    """`entries` cut into pages of at most REVOCATIONS_PER_PAGE, in order (one empty page for
    none)."""
    size = REVOCATIONS_PER_PAGE
    num_pages = max(1, -(-len(entries) // size))
    return [Revocations(entries[i * size : (i + 1) * size], i, num_pages) for i in range(num_pages)]


def issue_revocation(organiser_seed: bytes, peer: str) -> Revocation:
    """A revocation of every token of `peer`, signed with the organiser's key."""
    unsigned = Revocation(peer, identity.peer_id_of(organiser_seed))
    signature = identity.sign(organiser_seed, unsigned.signed_bytes()).hex()
    return Revocation(unsigned.peer, unsigned.issuer, signature)


def revocation_problem(revocation: Revocation, organiser: str | None) -> str | None:
    """Why `revocation` is not the word of `organiser`, or None."""
    if organiser is None or revocation.issuer != organiser:
        return f"issued by {revocation.issuer}, not by the organiser {organiser}"
    key = identity.public_key_of_peer_id(revocation.issuer)
    sig = bytes.fromhex(revocation.sig)
    if key is None or not identity.verify(key, revocation.signed_bytes(), sig):
        return "its signature does not verify"
    return None


def read_revocations(path: str, bad: list[str] | None = None) -> tuple[Revocation, ...]:
    """The revocations in a file, one `token revoke` line each (blank and # lines skipped), any
    number of them; OSError for an unreadable file. A bad line is a WireError, or, given `bad`,
    skipped and described there ("line N: why"): one torn append must not hide the rest."""
    entries = []
    # a byte that is no UTF-8 makes its line bad (a WireError), not the whole read a crash
    with open(path, encoding="utf-8", errors="replace") as f_in:
        number = 0
        while line := f_in.readline(MAX_TOKEN_CHARS + 2):  # a line's length is bounded
            number += 1
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                entries.append(Revocation.decode(text))
            except WireError as exc:
                if bad is None:
                    raise
                bad.append(f"line {number}: {exc}")
    return tuple(entries)


def read_token(text_or_path: str) -> Token:
    """A token given on the command line: the text itself, or a file holding it."""
    text = text_or_path.strip()
    if not text.startswith(TOKEN_PREFIX):
        try:
            with open(text, encoding="utf-8") as f_in:
                text = f_in.read(MAX_TOKEN_CHARS + 1).strip()
        except (OSError, ValueError) as exc:  # ValueError: UnicodeDecodeError, a NUL in the name
            raise WireError(f"malformed token: not a token, nor a readable file ({exc})") from None
    return Token.decode(text)
