"""The NVIDIA DALI backend: the pipeline graph, the loader around it and the shard index."""
