"""The tasks notebook 18 trains on, and the loss no model can go below on each: its floor.

    sort    data.sequence_task("sort"): 16 tokens, a separator, the same tokens sorted; only
            the sorted half is scored. Each scored token is a function of the input, so a
            perfect model has loss 0: the floor is 0, and training drives the loss towards it.
    markov  sequences of a fixed random Markov chain over 16 tokens, as a language has words:
            the first token uniform, each next one drawn from its predecessor's row of the
            transition matrix T (rows: softmax of Gaussian logits, a few likely successors
            each). Every position is scored. No model can predict a draw better than the
            distribution it is drawn from, so the expected loss at position t is at least
            sum_i P(x_t = i) H(T[i]) (H: entropy in nats) and the floor is its mean over the
            positions (``expected_floor``). On a given set of sequences the chain itself, the
            best possible model, has the loss ``sample_floor`` (its mean -log T[x_t, x_t+1]):
            the floor a held-out loss is compared with.

A relative gap (L_a - L_b) / L_b divides by the whole loss. On ``sort`` that loss is all
excess (floor 0) and goes to 0 with training, so any fixed gap becomes a large relative one.
On ``markov`` the loss stays above the floor, as a language model's stays above the entropy
of text; ``excess_gap`` divides by what is left to learn instead, the fairer measure.
"""
from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from source_code import data, workload

TASKS = ("sort", "markov")
SYMBOLS = 16                        # tokens of either task (sort adds its separator)
LENGTH = 32                         # positions a sequence is scored on (the model's max_len)
CHAIN_SEED = 1234                   # the chain is fixed: one "language" for every run
SHARPNESS = 2.5                     # std of the logits of a row: larger, fewer likely successors


def vocab_size(task: str) -> int:
    check(task)
    return workload.SORT_VOCAB if task == "sort" else SYMBOLS


def check(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")


def transition_matrix() -> torch.Tensor:
    """T (16, 16): T[i, j] = P(next token j | token i); each row sums to 1."""
    g = torch.Generator().manual_seed(CHAIN_SEED)
    logits = torch.randn(SYMBOLS, SYMBOLS, generator=g, dtype=torch.float64) * SHARPNESS
    return logits.softmax(dim=1)


def markov_sequences(n: int, seed: int) -> torch.Tensor:
    """(n, LENGTH + 1) token ids drawn from the chain: a uniform first token, then T's rows."""
    t = transition_matrix()
    g = torch.Generator().manual_seed(seed)
    seq = torch.empty(n, LENGTH + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, SYMBOLS, (n,), generator=g)
    for k in range(LENGTH):
        seq[:, k + 1] = torch.multinomial(t[seq[:, k]], 1, generator=g).squeeze(1)
    return seq


def dataset(task: str, n: int, seed: int) -> TensorDataset:
    """(inputs, targets), each (n, 32): targets are the inputs shifted by one (-100: not scored)."""
    check(task)
    if task == "sort":
        return data.sequence_task("sort", n=n, seed=seed)
    seq = markov_sequences(n, seed)
    return TensorDataset(seq[:, :-1].clone(), seq[:, 1:].clone())


def train_set(task: str, seed: int) -> TensorDataset:
    return workload.sort_task(2048) if task == "sort" else dataset(task, 2048, 10_000 + seed)


def held_out_set(task: str, seed: int) -> TensorDataset:
    return dataset(task, 128, seed + 1)


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each row of ``p`` (0 log 0 = 0)."""
    return -(p * p.clamp_min(1e-300).log()).sum(-1)


def expected_floor(task: str) -> float:
    """The lowest expected loss any model can have on ``task`` (see the module docstring)."""
    check(task)
    if task == "sort":
        return 0.0                  # the scored tokens are a function of the input
    t = transition_matrix()
    h = entropy(t)                                       # (16,) entropy of each row
    p = torch.full((SYMBOLS,), 1.0 / SYMBOLS, dtype=torch.float64)
    total = 0.0
    for _ in range(LENGTH):                              # predicting x_{k+1} from x_k
        total += float(p @ h)
        p = p @ t
    return total / LENGTH


def sample_floor(task: str, held: TensorDataset) -> float:
    """The loss of the true process on these sequences: the best any model can score on them."""
    check(task)
    x, y = held.tensors
    if task == "sort":
        return 0.0                  # the true next sorted token has probability 1
    keep = y != -100
    return float(-transition_matrix()[x[keep], y[keep]].log().mean())


def excess_gap(loss: float, base: float, floor: float) -> float:
    """(loss - base) / (base - floor): a gap relative to what ``base`` has left to learn."""
    if base <= floor:
        raise ValueError(f"the base loss {base:.4f} is at or below the floor {floor:.4f}: "
                         "nothing left to learn, the excess gap is undefined")
    return (loss - base) / (base - floor)
