"""Decoder language models: one file per architecture over the shared layers."""
