"""Ferry's composition root and desktop shell: CLI, settings, paths, logging, launching."""
