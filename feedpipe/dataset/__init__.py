"""Dataset layer: the manifest, the format readers and writers and their registry
(:mod:`.registry`), and ``verify``. Imports the schema layer only."""
