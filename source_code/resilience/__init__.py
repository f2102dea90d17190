"""Resilience beyond restart (notebook 17): per-step fault tolerance with torchft against a
restart from a snapshot, silent-data-corruption checks, stragglers and hangs, resharding."""
