"""Ferry's fused CPU kernels: C sources (csrc/: ferry.h, the headers that declare every entry
point, one .c file per kernel family), their build and loading (native.py, with cdecl.py
reading the headers' declarations), and the Python entry points the model and attention call
(ops.py)."""
