"""Runnable code of the distributed-training workshop; the notebooks call into it."""
