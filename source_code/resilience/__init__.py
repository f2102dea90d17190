"""Resilience beyond restart (notebook 17): per-step fault tolerance with torchft against a
restart from a snapshot, silent-data-corruption checks, stragglers and hangs, elastic membership
(elastic.py: torchrun agents as nodes, one dies, one joins) and resharding on the new world size."""
