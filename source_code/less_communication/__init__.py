"""Training with less communication (notebook 18): the link decides, and four ways to send less.

One concept a file, read in this order:

* ``links.py``       the links (alpha, beta and where the numbers come from) and the share of a
                     step an all-reduce takes on each, with the alpha-beta model of notebook 03;
* ``slow_link.py``   ``SlowLink``: counts every collective and charges it the time of a chosen
                     link (optionally sleeping that long), so CPU runs show what a slow link does;
                     ``LinkInFlight``: the same for an all-reduce in flight (waited out at ``wait``);
* ``compression.py`` DDP communication hooks: fp16/bf16 compression, PowerSGD by hand (rank-r
                     P and Q, one orthogonalisation, error feedback) and torch's PowerSGDState;
* ``local_sgd.py``   local SGD and DiLoCo by hand: H inner steps, then an average of the
                     parameters or an outer Nesterov step on the averaged pseudo-gradient;
* ``streaming.py``   streaming DiLoCo: fragments synchronised in turn, optionally in fp16,
                     their all-reduces optionally in flight for tau inner steps (overlap);
* ``harness.py``     every method trained in one process group, the same batches, counted;
* ``payoff.py``      which method reaches a target loss first in simulated time, per link;
* ``train.py``       the entry point (summary line), ``exercises.py`` the notebook's exercise,
  ``figures.py``     its plots.
"""
