"""One Ed25519 identity per node, shared by the control plane (py-libp2p) and the worker (hivemind).

Pure on purpose: neither libp2p nor hivemind is imported here, so both processes can use it.
The file holds py-libp2p's serialized protobuf PrivateKey: b"\\x08\\x01\\x12\\x20" + 32-byte seed.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from p2ptrain.key_file import PRIVATE_HEADER_32, PRIVATE_HEADER_64, base58_decode, base58_encode
from p2ptrain.key_file import SEED_NUM_BYTES as SEED_NUM_BYTES  # the key file's, here too
from p2ptrain.key_file import load_identity as load_identity
from p2ptrain.key_file import load_or_create_identity as load_or_create_identity
from p2ptrain.procs import sweep_pid_dirs

_PUBLIC_HEADER = b"\x08\x01\x12\x20"
_IDENTITY_MULTIHASH = b"\x00"


def public_key(seed: bytes) -> bytes:
    """The raw 32-byte Ed25519 public key of a seed."""
    return (
        Ed25519PrivateKey.from_private_bytes(seed)
        .public_key()
        .public_bytes(Encoding.Raw, PublicFormat.Raw)
    )


def sign(seed: bytes, data: bytes) -> bytes:
    """A 64-byte Ed25519 signature of data."""
    return Ed25519PrivateKey.from_private_bytes(seed).sign(data)


def verify(public_key_bytes: bytes, data: bytes, signature: bytes) -> bool:
    """True when signature is a valid Ed25519 signature of data by public_key_bytes."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key_bytes).verify(signature, data)
    except Exception:  # InvalidSignature, or malformed key/signature bytes
        return False
    return True


def peer_id_of(seed: bytes) -> str:
    """The libp2p peer id (12D3KooW...) of a seed: base58 of the identity multihash of the key."""
    return peer_id_of_public_key(public_key(seed))


def peer_id_of_public_key(public_key_bytes: bytes) -> str:
    """The libp2p peer id of a raw 32-byte Ed25519 public key."""
    encoded = _PUBLIC_HEADER + public_key_bytes
    return base58_encode(_IDENTITY_MULTIHASH + bytes([len(encoded)]) + encoded)


def public_key_of_peer_id(peer_id: str) -> bytes | None:
    """The Ed25519 public key embedded in an identity-multihash peer id, or None if it has none."""
    try:
        raw = base58_decode(peer_id)
    except ValueError:
        return None
    if len(raw) != 38 or raw[:2] != b"\x00\x24" or raw[2:6] != _PUBLIC_HEADER:
        return None
    return raw[6:]


def hivemind_key_bytes(seed: bytes) -> bytes:
    """The key as hivemind's p2pd wants it: PrivateKey protobuf with data = seed + public key."""
    return PRIVATE_HEADER_64 + seed + public_key(seed)


def libp2p_key_bytes(seed: bytes) -> bytes:
    """The key as py-libp2p writes it: PrivateKey protobuf with data = the 32-byte seed."""
    return PRIVATE_HEADER_32 + seed


class DaemonKeyCopy:
    """The node's key in the 64-byte form hivemind's p2pd reads (`hivemind_key_bytes`), for the
    moment p2pd takes to read it: in a 0700 directory beside the identity file (never the system
    temp directory, where every worker start used to leave one), removed by `remove` as soon as
    p2pd has started, and at exit. A copy a SIGKILL left behind stays beside the identity and is
    swept by the next start. Without an identity file (a throwaway key): a fresh 0700 temp dir."""

    def __init__(self, seed: bytes, identity_path: str | os.PathLike[str] | None) -> None:
        if identity_path is None:
            self.directory = Path(tempfile.mkdtemp(prefix="p2ptrain-p2pd-key-"))
        else:
            key = Path(identity_path).resolve()
            sweep_daemon_key_copies(key)
            self.directory = key.parent / f"{_copy_prefix(key)}{os.getpid()}"
            shutil.rmtree(self.directory, ignore_errors=True)  # a dead namesake's (pid reuse)
            self.directory.mkdir(mode=0o700)
        self.directory.chmod(0o700)  # whatever the umask
        self.path = self.directory / "p2pd.key"
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(hivemind_key_bytes(seed))
        atexit.register(self.remove)

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        atexit.unregister(self.remove)


def sweep_daemon_key_copies(identity_path: str | os.PathLike[str]) -> list[Path]:
    """Remove the copies of this identity's key that workers no longer alive left; those
    removed."""
    key = Path(identity_path).resolve()
    return sweep_pid_dirs(key.parent, _copy_prefix(key))


def _copy_prefix(key: Path) -> str:
    return f".{key.name}.p2pd-"
