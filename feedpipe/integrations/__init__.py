"""feedpipe inside the trainers people use, each an optional extra: Lightning, accelerate and
the HF ``Trainer``, with exact epochs and resume (docs/trainers.md)."""
