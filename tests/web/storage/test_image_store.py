"""A conversation's pictures in SQLite: stored with their message in one transaction, listed
in order, read back byte for byte, counted against the conversation, deleted with the
message or the conversation; a version 3 database gains the table in place."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from web.storage.images import NewImage
from web.storage.store import SCHEMA_VERSION, Store


def picture(tag: bytes, size: int = 100) -> NewImage:
    return NewImage("image/png", 4, 3, tag * size, b"thumb-" + tag, "image/jpeg")


def test_pictures_live_and_die_with_their_message_and_conversation(tmp_path: Path) -> None:
    store = Store(tmp_path / "ferry.sqlite3")
    conv = store.create_conversation("alice", "Pictures")
    other = store.create_conversation("alice", "Other")
    first = store.add_message(conv.id, "user", "look", images=[picture(b"a"), picture(b"b")])
    store.add_message(conv.id, "assistant", "nice")
    later = store.add_message(conv.id, "user", "and this", images=[picture(b"c", 50)])
    store.add_message(other.id, "user", "elsewhere", images=[picture(b"d")])
    shown = store.images(conv.id)
    assert list(shown) == [first.id, later.id]
    a, b = shown[first.id]
    assert (a.position, b.position, a.media_type, a.width, a.height, a.size) == (
        0, 1, "image/png", 4, 3, 100)
    assert store.image_data(a.id) == b"a" * 100 and store.image_data(b.id) == b"b" * 100
    assert store.image_data(a.id, thumb=True) == b"thumb-a"
    assert store.image(a.id) == a and store.image(10_000) is None
    assert store.image_bytes(conv.id) == 250 and store.image_bytes(other.id) == 100
    # an edited question starts over after itself: the later message's picture goes
    store.delete_after(conv.id, first.id)
    assert list(store.images(conv.id)) == [first.id]
    assert store.image_bytes(conv.id) == 200
    store.delete_conversation(conv.id)
    assert store.images(conv.id) == {} and store.image(a.id) is None
    assert store.image_bytes(other.id) == 100
    store.close()


def test_a_failed_picture_leaves_no_message(tmp_path: Path) -> None:
    store = Store(tmp_path / "ferry.sqlite3")
    conv = store.create_conversation("alice", "Pictures")
    broken = NewImage("image/png", 1, 1, None, b"", "image/png")  # type: ignore[arg-type]
    with pytest.raises(sqlite3.IntegrityError):
        store.add_message(conv.id, "user", "look", images=[picture(b"a"), broken])
    assert store.messages(conv.id) == [] and store.images(conv.id) == {}
    store.close()


def test_import_keeps_pictures_by_message_index(tmp_path: Path) -> None:
    store = Store(tmp_path / "ferry.sqlite3")
    conv = store.import_conversation(
        "alice", "Imported", (None, None, None, None),
        [("user", "one", "complete", None, None, None),
         ("assistant", "two", "complete", "stop", None, None),
         ("user", "three", "complete", None, None, None)],
        images={2: [picture(b"z")]})
    users = [m for m in store.messages(conv.id) if m.role == "user"]
    assert list(store.images(conv.id)) == [users[1].id]
    store.close()


def test_a_version_3_database_gains_the_pictures_table(tmp_path: Path) -> None:
    path = tmp_path / "ferry.sqlite3"
    store = Store(path)
    conv = store.create_conversation("alice", "Old")
    store.add_message(conv.id, "user", "hi")
    store.close()
    old = sqlite3.connect(path)
    old.execute("DROP TABLE images")
    old.execute("PRAGMA user_version = 3")
    old.commit()
    old.close()
    again = Store(path)
    assert again.schema_version == SCHEMA_VERSION == 4
    assert [m.content for m in again.messages(conv.id)] == ["hi"]
    again.add_message(conv.id, "user", "now with a picture", images=[picture(b"p")])
    assert again.image_bytes(conv.id) == 100
    again.close()
