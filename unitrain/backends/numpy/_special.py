"""The error function and its complement in float64, for the numpy reference's ``erf`` and ``gelu``.

numpy has no error function. scipy's is used where scipy is installed (scikit-learn, a
dependency, brings it); without it the reference computes its own, to 1e-15 relative (erfc
to 1e-14) for every input: below 1.25 the series
erf(x) = 2/sqrt(pi) e^(-x^2) sum_k (2x^2)^k x / (1*3*...*(2k+1)), whose terms are all positive
(no cancellation, unlike Taylor's); from 1.25 on Laplace's continued fraction
erfc(x) = e^(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))), which converges the
slower the smaller x is. The term counts reach float64 rounding at each band's lower end, the
worst case (measured against mpmath at 40 digits). Both are returned because each is accurate
where it is small: ``gelu``'s normal CDF takes erfc far into the lower tail.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

try:
    from scipy import special as _scipy_special
except ImportError:  # pragma: no cover - scikit-learn brings scipy
    _scipy_special = None

__all__ = ["TWO_OVER_SQRT_PI", "erf_and_erfc", "own_erf_and_erfc"]

# The series below _SERIES_END; the continued fraction above it, with fewer terms from _FAR on.
_SERIES_END, _SERIES_TERMS = 1.25, 22
_FAR, _MIDDLE_TERMS, _FAR_TERMS = 2.0, 150, 55
TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)
_SERIES_COEFFICIENTS = [1 / math.prod(range(1, 2 * k + 2, 2)) for k in range(_SERIES_TERMS)]


def _exp_minus_square(x: np.ndarray) -> np.ndarray:
    """``e ** -x**2`` without the rounding of ``x**2`` (which e**-36 would amplify 36 times):
    ``x`` split into a head with few bits, whose square is exact, and the rest."""
    head = np.round(x * 16) / 16
    return np.exp(-head * head) * np.exp(-(x - head) * (x + head))


def _erf_series(x: np.ndarray) -> np.ndarray:
    # Horner's rule over the coefficients 1 / (1*3*...*(2k+1)) of (2x^2)^k, in place.
    twice_square = 2 * x * x
    total = np.full_like(x, _SERIES_COEFFICIENTS[-1])
    for coefficient in _SERIES_COEFFICIENTS[-2::-1]:
        total *= twice_square
        total += coefficient
    return TWO_OVER_SQRT_PI * _exp_minus_square(x) * x * total


def _erfc_fraction(x: np.ndarray, terms: int) -> np.ndarray:
    tail = x.copy()  # evaluated from the deepest level up, in place
    for k in range(terms, 0, -1):
        np.divide(k / 2, tail, out=tail)
        tail += x
    return _exp_minus_square(x) / (math.sqrt(math.pi) * tail)


def erf_and_erfc(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(erf(x), erfc(x))`` in float64, each accurate where it is small: scipy's when it is
    installed (it comes with scikit-learn; its kernels are several times faster, and GELU
    calls this twice per pass), else :func:`own_erf_and_erfc`."""
    if _scipy_special is not None:
        x = np.asarray(x, dtype=np.float64)
        return _scipy_special.erf(x), _scipy_special.erfc(x)
    return own_erf_and_erfc(x)


def own_erf_and_erfc(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(erf(x), erfc(x))`` in float64 without scipy, by the series and the fraction."""
    x = np.asarray(x, dtype=np.float64)
    size = np.abs(x)
    erf_size, erfc_size = np.empty_like(size), np.empty_like(size)
    near, far = size < _SERIES_END, ~(size < _FAR)  # NaN goes far, and stays NaN
    middle = ~near & ~far
    erf_size[near] = _erf_series(size[near])
    erfc_size[near] = 1 - erf_size[near]
    erfc_size[middle] = _erfc_fraction(size[middle], _MIDDLE_TERMS)
    # erfc(28) rounds to 0 in float64: larger sizes (inf) take its value.
    erfc_size[far] = _erfc_fraction(np.minimum(size[far], 28.0), _FAR_TERMS)
    erf_size[~near] = 1 - erfc_size[~near]
    return np.copysign(erf_size, x), np.where(x < 0, 2 - erfc_size, erfc_size)
