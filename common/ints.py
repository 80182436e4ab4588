"""Integer math for launchers, in plain Python.

triton.cdiv and triton.next_power_of_2 are Triton constexpr functions: called from the host, each
call unwraps its arguments through Triton's constexpr machinery, ~1.5 us on a fast CPU and ~6 us on
the H100 host of benchmarks/results, where a launcher makes several of them next to a GPU time of
a few microseconds. These take well under 0.1 us.
"""


def cdiv(a, b):
    """ceil(a / b) for integers, b > 0."""
    return -(-a // b)


def next_power_of_2(n):
    """The smallest power of two >= n, for n >= 1 (0 for n = 0, as Triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
