"""Kubernetes resource quantities (``500m``, ``1Gi``, ``1k``, ``2e3``) as exact numbers.

The API server stores a quantity in canonical form: ``0.5`` comes back as ``500m``, ``1000`` as
``1k``, ``1024Mi`` as ``1Gi``. Comparing the strings would see a difference on every pass and
patch forever; :func:`parse` gives values that compare equal exactly when the server would
treat them as the same quantity. The grammar is the API's (``k8s.io/apimachinery``
``pkg/api/resource/quantity.go``): a signed decimal number, then a binary suffix (``Ki`` ...
``Ei``), a decimal suffix (``n``, ``u``, ``m``, none, ``k``, ``M`` ... ``E``) or a decimal
exponent (``e3``, ``E-2``).
"""

from __future__ import annotations

import re
from fractions import Fraction

_BINARY: dict[str, int] = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: dict[str, Fraction] = {
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18)}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))"
                       r"(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")


def parse(text: str) -> Fraction | None:
    """The exact value of a quantity string, or ``None`` if ``text`` is not a quantity."""
    match = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        return None
    number, suffix = Fraction(match.group(1)), match.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    exponent = int(suffix[1:])
    scale = Fraction(10**exponent) if exponent >= 0 else Fraction(1, 10**-exponent)
    return number * scale


def same(a: str, b: str) -> bool:
    """``a`` and ``b`` are the same quantity (``"1000"`` and ``"1k"``); strings that are not
    both quantities are the same only when equal."""
    if a == b:
        return True
    left, right = parse(a), parse(b)
    return left is not None and left == right
