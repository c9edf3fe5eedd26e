"""Training: the Trainer loop, its factory, the end of a run, schedules, the run directory."""
