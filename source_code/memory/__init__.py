"""Memory, precision and recomputation: where the bytes of training go on one device."""
