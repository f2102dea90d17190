"""Capstone: one model under every parallelism of notebooks 05-14, the same loss; and the loss
normalisation that uneven token counts demand.

* ``seed.py``: the one seed checkpoint, the global batches (with uneven valid tokens) and the
  one-process reference run every configuration is compared with;
* ``normalisation.py``: per-rank / per-microbatch mean losses against the per-token mean, for
  DDP, gradient accumulation and pipeline microbatches, and the fix;
* ``runners_dp.py``, ``runners_model.py``, ``runners_combo.py``: one training step per
  configuration, built from the packages of notebooks 05-14;
* ``cp_model.py``: the TransformerLM forward on this rank's tokens with ring attention;
* ``matrix.py``: every configuration in one set of processes, against the reference;
* ``choose.py``: dp, tp, pp, cp, ep sizes -> a configuration, refused in one line when impossible;
* ``exercises.py``: the seeded bug of notebook 19 and its check;
* ``figures.py``: the loss curves and the table of differences.

    python -m source_code.capstone.matrix      # the summary line
"""
