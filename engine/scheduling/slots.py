"""The request table: one slot per admitted request, whatever its length."""
from __future__ import annotations


class SlotTable:
    def __init__(self, num_slots: int) -> None:
        self.owners: list[str | None] = [None] * num_slots
        self._free: list[int] = list(range(num_slots - 1, -1, -1))  # pop() gives the lowest

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, request_id: str) -> int:
        slot = self._free.pop()
        self.owners[slot] = request_id
        return slot

    def free(self, slot: int) -> None:
        assert self.owners[slot] is not None, f"slot {slot} is already free"
        self.owners[slot] = None
        self._free.append(slot)
        self._free.sort(reverse=True)
