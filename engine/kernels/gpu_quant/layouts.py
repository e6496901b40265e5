"""The GGUF block layouts the device kernels multiply: per ggml type id, the values and
bytes of one block (ggml's own layout, kept byte for byte on the device)."""
from __future__ import annotations

Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K = 2, 3, 6, 8, 12, 13, 14

# ggml type id -> (name, values per block, bytes per block)
LAYOUTS: dict[int, tuple[str, int, int]] = {
    Q4_0: ("Q4_0", 32, 18),   # f16 d, 16 bytes of 4-bit values: (q - 8) * d
    Q4_1: ("Q4_1", 32, 20),   # f16 d, f16 m, 16 bytes of 4-bit values: q * d + m
    Q5_0: ("Q5_0", 32, 22),   # f16 d, 32 fifth bits, 16 bytes of low nibbles: (q - 16) * d
    Q8_0: ("Q8_0", 32, 34),   # f16 d, 32 int8: q * d
    Q4_K: ("Q4_K", 256, 144),  # f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 of nibbles
    Q5_K: ("Q5_K", 256, 176),  # as Q4_K, with 32 bytes of fifth bits before the nibbles
    Q6_K: ("Q6_K", 256, 210),  # 128 low nibbles, 64 of 2-bit highs, 16 int8 scales, f16 d
}


def supported(qtype: int) -> bool:
    return qtype in LAYOUTS


def name(qtype: int) -> str:
    return LAYOUTS[qtype][0]


def row_bytes(qtype: int, in_features: int) -> int:
    """Bytes of one row of `in_features` values (a whole number of blocks)."""
    _, block, nbytes = LAYOUTS[qtype]
    if in_features <= 0 or in_features % block:
        raise ValueError(f"{name(qtype)} rows hold whole blocks of {block} values; "
                         f"{in_features} values per row do not fit")
    return in_features // block * nbytes
