"""Running on a cluster: the stall watchdog, preemption signals and a failed run's record."""
