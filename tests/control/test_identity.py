import os
import stat

import pytest

from p2ptrain import identity
from p2ptrain.errors import UserError


def test_created_key_is_private_and_stable(tmp_path):
    path = tmp_path / "node.key"
    seed = identity.load_or_create_identity(path)
    assert len(seed) == 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_bytes() == b"\x08\x01\x12\x20" + seed
    assert identity.load_or_create_identity(path) == seed


def test_peer_id_matches_libp2p_and_embeds_the_key():
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    seed = bytes(range(32))
    expected = ID.from_pubkey(create_new_key_pair(seed).public_key).to_base58()
    assert identity.peer_id_of(seed) == expected
    assert expected.startswith("12D3KooW")
    assert identity.public_key_of_peer_id(expected) == identity.public_key(seed)
    assert identity.public_key_of_peer_id("QmNotAnEd25519Key") is None


def test_hivemind_form_is_seed_plus_public_key(tmp_path):
    seed = os.urandom(32)
    data = identity.hivemind_key_bytes(seed)
    assert data == b"\x08\x01\x12\x40" + seed + identity.public_key(seed)
    path = tmp_path / "hm.key"
    path.write_bytes(data)
    assert identity.load_identity(path) == seed


def test_sign_and_verify():
    seed = os.urandom(32)
    sig = identity.sign(seed, b"data")
    assert identity.verify(identity.public_key(seed), b"data", sig)
    assert not identity.verify(identity.public_key(seed), b"other", sig)
    assert not identity.verify(b"short", b"data", sig)


def test_garbage_key_file_is_a_user_error(tmp_path):
    path = tmp_path / "bad.key"
    path.write_bytes(b"not a key")
    with pytest.raises(UserError, match="not an Ed25519"):
        identity.load_identity(path)
