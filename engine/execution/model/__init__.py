"""Model code: a Llama-family decoder over packed ragged tokens and a paged KV pool."""
