"""Capstone: one model under every parallelism of notebooks 05-14, the same loss; and the loss
normalisation that uneven token counts demand.

* ``seed.py``: the one seed checkpoint, the global batches (with uneven valid tokens) and the
  one-process reference run every configuration is compared with;
* ``loss.py``: each piece's summed loss / the step's global count of valid targets;
* ``normalisation.py``: per-rank / per-microbatch mean losses against the per-token mean, for
  DDP, accumulation, DDP with accumulation, context parallelism and torch's pipeline schedule;
* ``runners_dp.py``, ``runners_model.py``, ``runners_pipeline.py``, ``runners_combo.py``,
  ``runners_3d.py``: one training step per configuration, built from the packages of 05-14;
* ``cp_model.py``: the TransformerLM forward on this rank's tokens with ring attention;
* ``compare.py``: one configuration against one process (loss curve, final weights, every
  parameter held by some rank);
* ``expert_groups.py``: which ranks sum an expert's gradient when ep takes its ranks from
  dp x cp x tp (torchtitan's sparse mesh), checked on one process by counting tokens;
* ``matrix.py``: every configuration in 2, 4 and 8 processes, fp32 and fp64, against the reference;
* ``choose.py``: dp, tp, pp, cp, ep sizes -> a configuration, refused in one line when impossible;
* ``exercises.py``: notebook 19's handed step, its gradient report and the check;
* ``figures.py``: the uneven-token bars, the loss curves and the differences.

    python -m source_code.capstone.matrix      # the summary line
"""
