"""feedpipe inside the trainers people use, each an optional extra: :mod:`.lightning`
(``FeedpipeDataModule``), :mod:`.accelerate` (``prepare``) and :mod:`.transformers`
(``FeedpipeTrainer``, the HF ``Trainer``). Each keeps epochs and resume exact, counts every
evaluation sample once and reports the data-wait share to the trainer's logger
(docs/trainers.md).
"""
