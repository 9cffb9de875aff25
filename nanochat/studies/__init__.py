"""What the runs are worth: the compute multiplier, the iso-FLOP frontier and their statistics."""
