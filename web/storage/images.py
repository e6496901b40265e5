"""A conversation's pictures in the store's `images` table (its schema is in store.py):
stored with their message in the message's transaction, listed by message, read back as
sent or as their thumbnail, and counted against the conversation's limit."""
from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass

IMAGE_COLUMNS = "id, message_id, conversation_id, position, media_type, width, height, " \
    "length(data) AS size, thumb_type"


@dataclass(frozen=True, slots=True)
class NewImage:
    """A checked picture to attach to a message (web.pages.chat.uploads makes them)."""

    media_type: str  # image/png | image/jpeg | image/webp | image/gif
    width: int
    height: int
    data: bytes  # the file as sent
    thumb: bytes  # a small preview of it
    thumb_type: str


@dataclass(frozen=True, slots=True)
class StoredImage:
    """A message's picture as listed (its bytes are read apart: image_data)."""

    id: int
    message_id: int
    conversation_id: int
    position: int
    media_type: str
    width: int
    height: int
    size: int  # bytes
    thumb_type: str


class ImageTable:
    """The Store's picture rows (a part of Store, which owns the connection and lock)."""

    _db: sqlite3.Connection
    _lock: threading.Lock

    def _run(self, sql: str, args: tuple[object, ...] = ()) -> sqlite3.Cursor:
        raise NotImplementedError  # Store's: one statement under its lock

    def _insert_images(self, conversation_id: int, message_id: int,
                       images: Sequence[NewImage]) -> None:
        """Inside a transaction the caller holds (and the lock)."""
        for position, im in enumerate(images):
            self._db.execute(
                "INSERT INTO images (message_id, conversation_id, position, media_type, width, "
                "height, data, thumb, thumb_type) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (message_id, conversation_id, position, im.media_type, im.width, im.height,
                 im.data, im.thumb, im.thumb_type))

    def images(self, conversation_id: int) -> dict[int, list[StoredImage]]:
        """The conversation's pictures by message id, in the order they were attached."""
        rows = self._run(f"SELECT {IMAGE_COLUMNS} FROM images WHERE conversation_id = ? "
                         "ORDER BY message_id, position", (conversation_id,)).fetchall()
        out: dict[int, list[StoredImage]] = {}
        for r in rows:
            out.setdefault(int(r["message_id"]), []).append(StoredImage(**dict(r)))
        return out

    def image(self, image_id: int) -> StoredImage | None:
        row = self._run(f"SELECT {IMAGE_COLUMNS} FROM images WHERE id = ?",
                        (image_id,)).fetchone()
        return StoredImage(**dict(row)) if row else None

    def image_data(self, image_id: int, thumb: bool = False) -> bytes | None:
        """The file as sent, or its thumbnail."""
        column = "thumb" if thumb else "data"
        row = self._run(f"SELECT {column} FROM images WHERE id = ?", (image_id,)).fetchone()
        return bytes(row[0]) if row else None

    def image_bytes(self, conversation_id: int) -> int:
        """Bytes of the pictures the conversation holds (its limit counts them)."""
        row = self._run("SELECT COALESCE(SUM(length(data)), 0) FROM images "
                        "WHERE conversation_id = ?", (conversation_id,)).fetchone()
        return int(row[0])
