"""Training with less communication (notebook 18): the link decides, and four ways to send less.

One concept a file, read in this order:

* ``links.py``       the links (alpha, beta and where the numbers come from), a link set from a
                     measured time, and the share of a step an all-reduce takes on each, with
                     the alpha-beta model of notebook 03;
* ``slow_link.py``   ``SlowLink``: counts every collective and charges it the time of a chosen
                     link (optionally sleeping that long), so CPU runs show what a slow link does;
                     ``LinkInFlight``: the same for an all-reduce in flight (waited out at ``wait``);
* ``compression.py`` DDP communication hooks: fp16/bf16 compression, PowerSGD by hand (rank-r
                     P and Q, one orthogonalisation, error feedback) and torch's PowerSGDState,
                     started from the same Q as ours;
* ``local_sgd.py``   local SGD and DiLoCo by hand: H inner steps, then an average of the
                     parameters or an outer Nesterov step on the averaged pseudo-gradient;
* ``lowbit.py``      pseudo-gradients sent in fp16 or 4 bits (E3M0) and summed in fp32;
* ``streaming.py``   streaming DiLoCo: consecutive or strided fragments synchronised in turn,
                     their all-reduces optionally in flight for tau inner steps (overlap);
* ``harness.py``     one method trained from the common pretrained start, counted, evaluated
                     on synchronised models; ``checks.py`` the runs that sleep or wait out a
                     link set from a measured step; ``experiment.py`` every run of the notebook;
* ``payoff.py``      time to a target loss per link, and the bandwidth where two methods swap;
* ``train.py``       the entry point (summary line), ``exercises.py`` the notebook's exercise,
  ``figures.py``     its plots, ``tasks.py`` the tasks and their loss floors,
  ``torchft_diloco.py`` torchft's LocalSGD and DiLoCo beside ours.
"""
