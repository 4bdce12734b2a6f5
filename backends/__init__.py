"""Built-in backends, importable as ``unitrain.backends.<name>``; each imports its framework."""
