"""Loader layer: ``make_loader`` (:mod:`.api`), its config and protocol, the sampler both
backends share, the CPU transforms, and the ``torch`` and ``dali`` backends."""
