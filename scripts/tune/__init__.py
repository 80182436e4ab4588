"""The sweeps behind the launch tables; their figures are in docs/tuning/."""
