"""A stand-in for torchvision, which has no CPU wheel here: only the names that LitData 0.2.76 and
Mosaic Streaming 0.13 import on the paths this benchmark uses (see benchmarks/peers/README.md).

Put benchmarks/peers/shims on PYTHONPATH for those two contenders only; nothing else is provided.
"""
