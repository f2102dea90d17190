"""Reference solution of notebook 03's exercise: all-gather from point-to-point messages.

    python -m source_code.solutions.nb03_collectives      # runs the notebook's check on it
"""
import torch.distributed as dist


def p2p_all_gather(output, x):
    """output: [N * n] on every rank; x: [n], this rank's piece. Afterwards output[r*n:(r+1)*n]
    holds rank r's x on every rank, as dist.all_gather_into_tensor(output, x) gives.

    Every rank sends its piece to each other rank and receives each other rank's piece straight
    into its slot: 2 (N-1) messages per rank, all posted as one batch (posting them one by one
    with blocking send/recv would deadlock). Each rank sends (N-1) x n elements: as many as
    the ring all-gather, but in one step instead of N-1."""
    rank, world = dist.get_rank(), dist.get_world_size()
    slots = output.chunk(world)       # N views of [n]: slot r is rank r's piece
    slots[rank].copy_(x)              # our own piece needs no message
    ops = []
    for peer in range(world):
        if peer != rank:
            ops.append(dist.P2POp(dist.isend, x, peer))
            ops.append(dist.P2POp(dist.irecv, slots[peer], peer))
    for work in dist.batch_isend_irecv(ops):
        work.wait()                   # every Work: one per operation on gloo, one in all on NCCL


if __name__ == "__main__":
    from source_code.sync.exercises import check_p2p_all_gather
    check_p2p_all_gather(p2p_all_gather)
