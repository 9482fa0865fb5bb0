"""The node's key file: read it, or create it the first time (stdlib only).

Apart from identity.py, which signs and verifies with the key, so that the node supervisor
(node/supervisor.py) creates the key before its children start without loading cryptography's
bindings (~7 MiB resident in each of a volunteer machine's supervisors).
The file holds py-libp2p's serialized protobuf PrivateKey: b"\\x08\\x01\\x12\\x20" + 32-byte seed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
from pathlib import Path

from p2ptrain.durable import sync_directory
from p2ptrain.errors import UserError
from p2ptrain.procs import pid_alive

SEED_NUM_BYTES = 32
# protobuf header: field 1 (KeyType) = 1 (Ed25519), field 2 (Data) with length 32 / 64
PRIVATE_HEADER_32 = b"\x08\x01\x12\x20"
PRIVATE_HEADER_64 = b"\x08\x01\x12\x40"


def load_or_create_identity(path: str | os.PathLike[str]) -> bytes:
    """Return the node's 32-byte Ed25519 seed, creating the key file (mode 0600) if it is
    missing. UserError (one line) if it cannot be created: a missing or read-only directory."""
    key_path = Path(path)
    _sweep_temp_files(key_path)
    if not key_path.exists():
        seed = os.urandom(SEED_NUM_BYTES)
        try:
            if not _create(key_path, PRIVATE_HEADER_32 + seed):
                return load_identity(key_path)  # another process created it first
        except OSError as exc:
            raise UserError(
                f"cannot create identity file {key_path}: {exc.strerror or exc}"
            ) from None
        return seed
    return load_identity(key_path)


def _create(path: Path, data: bytes) -> bool:
    """Write `data` as a new file at `path` (mode 0600), whole or not at all: written and synced
    under a temporary name, then linked to `path`, never clobbering a key another process just
    wrote (False then). A crash between creating and writing a key left an empty one: an
    unreadable identity at every start."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # named with our PID, so that what a SIGKILL left here (a private seed) is swept once we
    # are gone (_sweep_temp_files); the rest random, for two threads of ours
    fd, tmp = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp"
    )  # 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links (FAT, some FUSE ones)
            return _create_in_place(path, data)
        sync_directory(path.parent)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _sweep_temp_files(path: Path) -> list[Path]:
    """Remove the temporary files `_create` left beside `path` (`.NAME.PID.XXXX.tmp`) whose
    process is gone: a SIGKILL between writing one and unlinking it left the private seed
    there for good. Those removed."""
    removed = []
    with contextlib.suppress(OSError):  # a missing folder: nothing to sweep
        for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
            # PID.XXXX exactly (mkstemp's part has no dot): `.NAME.5.PID.XXXX.tmp` is NAME.5's
            pid_text, _, rest = tmp.name[len(path.name) + 2 : -len(".tmp")].partition(".")
            if not rest or "." in rest:
                continue
            # ASCII digits: str.isdigit() takes "²", which int() refuses
            if pid_text.isascii() and pid_text.isdigit() and not pid_alive(int(pid_text)):
                with contextlib.suppress(OSError):
                    tmp.unlink()
                    removed.append(tmp)
    return removed


def _create_in_place(path: Path, data: bytes) -> bool:
    """O_EXCL + 0600: never widen permissions, never clobber a key another process just wrote
    (False then); a crash before the sync may leave it empty, where no hard link avoids it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    sync_directory(path.parent)
    return True


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
