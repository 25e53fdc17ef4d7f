"""Small statistics helpers (an example file for `completer complete`)."""
import math


def mean(values):
    """Arithmetic mean of a non-empty sequence."""
    return sum(values) / len(values)


def variance(values):
    """Population variance."""
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / len(values)


def stdev(values):
    """Population standard deviation."""
    
