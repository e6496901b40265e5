"""Reading checkpoints: Hugging Face folders, GGUF files and their blocks, files by magic."""
