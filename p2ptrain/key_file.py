"""The node's key file: read it, or create it the first time (stdlib only).

Apart from identity.py, which signs and verifies with the key, so that the node supervisor
(node/supervisor.py) creates the key before its children start without loading cryptography's
bindings (~7 MiB resident in each of a volunteer machine's supervisors).
The file holds py-libp2p's serialized protobuf PrivateKey: b"\\x08\\x01\\x12\\x20" + 32-byte seed.
"""

from __future__ import annotations

import os
from pathlib import Path

from p2ptrain.errors import UserError

SEED_NUM_BYTES = 32
# protobuf header: field 1 (KeyType) = 1 (Ed25519), field 2 (Data) with length 32 / 64
PRIVATE_HEADER_32 = b"\x08\x01\x12\x20"
PRIVATE_HEADER_64 = b"\x08\x01\x12\x40"


def load_or_create_identity(path: str | os.PathLike[str]) -> bytes:
    """Return the node's 32-byte Ed25519 seed, creating the key file (mode 0600) if it is missing."""
    key_path = Path(path)
    if not key_path.exists():
        seed = os.urandom(SEED_NUM_BYTES)
        key_path.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL + 0600: never widen permissions, never clobber a key another process just wrote
        try:
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return load_identity(key_path)
        with os.fdopen(fd, "wb") as f:
            f.write(PRIVATE_HEADER_32 + seed)
        return seed
    return load_identity(key_path)


def load_identity(path: str | os.PathLike[str]) -> bytes:
    """Read a key file written by py-libp2p or by load_or_create_identity; return the seed."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read identity file {path}: {exc.strerror}") from exc
    if len(data) == 36 and data.startswith(PRIVATE_HEADER_32):
        return data[4:]
    if len(data) == 68 and data.startswith(PRIVATE_HEADER_64):
        return data[4:36]  # hivemind form: seed + public key
    raise UserError(f"identity file {path} is not an Ed25519 private key (36-byte protobuf)")


# peer ids are base58 text (Bitcoin's alphabet): the identity's, and those records name
BASE58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def base58_encode(data: bytes) -> str:
    number = int.from_bytes(data, "big")
    digits = []
    while number:
        number, rest = divmod(number, 58)
        digits.append(BASE58_ALPHABET[rest])
    num_leading_zeros = len(data) - len(data.lstrip(b"\x00"))
    return "1" * num_leading_zeros + "".join(reversed(digits))


def base58_decode(text: str) -> bytes:
    """ValueError for a character outside the alphabet."""
    number = 0
    for char in text:
        index = BASE58_ALPHABET.find(char)
        if index < 0:
            raise ValueError(f"not base58: {char!r}")
        number = number * 58 + index
    num_leading_zeros = len(text) - len(text.lstrip("1"))
    body = number.to_bytes((number.bit_length() + 7) // 8, "big") if number else b""
    return b"\x00" * num_leading_zeros + body
