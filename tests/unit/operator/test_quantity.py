"""Quantities compare by value, as the API server stores them (checked against the official
client's own parser)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from kubernetes.utils.quantity import parse_quantity

from tailguard.operator import quantity

SAMPLES = ["0", "1", "1000", "1k", "0.5", "500m", "1.5", "1500m", "1024Mi", "1Gi", "256Mi",
           "64Mi", "128974848", "129e6", "129M", "123Mi", "100u", "100n", "2E", "1Ei", "1e3",
           "1E-3", ".5", "5.", "+3", "-2k", "12", "8"]


@pytest.mark.parametrize("text", SAMPLES)
def test_parse_agrees_with_the_official_client(text: str) -> None:
    assert quantity.parse(text) == Fraction(parse_quantity(text))


@pytest.mark.parametrize("a,b", [("1000", "1k"), ("0.5", "500m"), ("1024Mi", "1Gi"),
                                 ("1e3", "1k"), ("1.5", "1500m")])
def test_canonical_forms_are_the_same_quantity(a: str, b: str) -> None:
    assert quantity.same(a, b) and quantity.same(b, a)


@pytest.mark.parametrize("a,b", [("1k", "1Ki"), ("500m", "5"), ("IfNotPresent", "Always"),
                                 ("1Gi", "1G"), ("25%", "0.25")])
def test_different_values_or_non_quantities_differ(a: str, b: str) -> None:
    assert not quantity.same(a, b)


@pytest.mark.parametrize("text", ["", "Gi", "1.2.3", "1 Gi", "1KiB", "abc", "1e", "--1"])
def test_non_quantities_parse_to_none(text: str) -> None:
    assert quantity.parse(text) is None
