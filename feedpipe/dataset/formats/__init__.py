"""One module per on-disk format: a reader and a writer over :mod:`.base`."""
