"""Reference solution of notebook 01's exercise (checked by source_code.basics.shard_exercise)."""


def combine_shard_gradients(grads, sizes):
    """Gradient of the mean loss over all examples from per-shard mean-loss gradients.

    Shard i's gradient is (1/n_i) * sum of its examples' gradients, so n_i * g_i is that sum;
    add the sums and divide by the total count. For equal shards this is the plain mean of the
    gradients, which is what DDP's all-reduce-and-divide computes.
    """
    total = sum(sizes)
    return sum(n * g for n, g in zip(sizes, grads)) / total

