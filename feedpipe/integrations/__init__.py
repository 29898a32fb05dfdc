"""feedpipe inside the trainers people use, each an optional extra:

- :mod:`.lightning`: ``FeedpipeDataModule`` (``pip install 'feedpipe[lightning]'``);
- :mod:`.accelerate`: ``prepare`` for accelerate's loops (``feedpipe[accelerate]``);
- :mod:`.transformers`: ``FeedpipeTrainer``, the HF ``Trainer`` on feedpipe loaders
  (``feedpipe[transformers]``).

Each keeps epochs and resume exact (the loader contract of :mod:`feedpipe.loader.position`),
counts every evaluation sample once (``Sampler(uneven="mask")``), and reports the data-wait share to the
trainer's own logger. docs/trainers.md shows each in use.
"""
