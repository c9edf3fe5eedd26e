"""Training: the Trainer loop, its factory, the end of a run, the run directory; the optimizer
update in update/."""
