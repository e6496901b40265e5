"""Ferry's fused CPU kernels: C source (cpu_kernels.c), its build and loading (native.py), and
the Python entry points the model and attention call (ops.py)."""
