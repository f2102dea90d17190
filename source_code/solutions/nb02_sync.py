"""Reference solution of notebook 02's exercise: the all-gather half of the ring all-reduce.

    python -m source_code.solutions.nb02_sync      # runs the notebook's check on it
"""


def all_gather_phase(chunks, rank, world, exchange):
    """After reduce-scatter, chunk (rank + 1) mod N is complete on this rank.

    In step s every rank forwards the complete chunk it got most recently -- (rank + 1 - s)
    mod N -- to its right neighbour and receives chunk (rank - s) mod N from its left one,
    overwriting its partial copy. After N-1 steps every chunk is complete everywhere.
    """
    for s in range(world - 1):
        exchange(chunks[(rank + 1 - s) % world], chunks[(rank - s) % world])


if __name__ == "__main__":
    from source_code.sync.exercises import check_all_gather
    check_all_gather(all_gather_phase)
