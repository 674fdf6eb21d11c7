"""Cache authentication: the key file's safety rules and the tag's binding to its parts."""

import os

from multiminddev.cuda import cache_auth


def test_key_is_made_once_private_and_beside_the_cache(tmp_path):
    root = tmp_path / "cache"
    key = cache_auth.load_or_create_key(root)
    path = cache_auth.key_path(root)
    assert key is not None and len(key) == cache_auth.KEY_BYTES
    assert path.parent == tmp_path and not path.is_relative_to(root)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert cache_auth.load_or_create_key(root) == key


def test_a_key_readable_by_others_is_refused(tmp_path):
    root = tmp_path / "cache"
    cache_auth.load_or_create_key(root)
    os.chmod(cache_auth.key_path(root), 0o644)
    assert cache_auth.load_or_create_key(root) is None


def test_a_symlinked_key_is_refused(tmp_path):
    root = tmp_path / "cache"
    planted = tmp_path / "known"
    planted.write_bytes(b"k" * cache_auth.KEY_BYTES)
    os.chmod(planted, 0o600)
    cache_auth.key_path(root).symlink_to(planted)
    assert cache_auth.load_or_create_key(root) is None


def test_tag_binds_every_part_and_their_boundaries():
    key = b"s" * 32
    tag = cache_auth.entry_tag(key, b"ab", b"c")
    assert cache_auth.tag_matches(key, tag, b"ab", b"c")
    assert not cache_auth.tag_matches(key, tag, b"a", b"bc")
    assert not cache_auth.tag_matches(key, tag, b"ab", b"d")
    assert not cache_auth.tag_matches(b"t" * 32, tag, b"ab", b"c")
    assert not cache_auth.tag_matches(key, None, b"ab", b"c")
