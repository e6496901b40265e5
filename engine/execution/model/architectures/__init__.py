"""One file per architecture over the shared layers; registry.py lists them."""
