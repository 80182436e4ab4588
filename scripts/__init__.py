"""Tools for developing the kernels: tuning sweeps, profiles, memory replays (not used by the kernels)."""
