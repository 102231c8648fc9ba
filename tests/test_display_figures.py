"""Figures as a colleague read them in `advisor plan`'s output: a 10^18-token budget said "budget 1e+03P tokens",
its train time "114030810.9 d", and a billion-sequence batch's step "16036492.260 s" and "fastest fitting plan of
each kind: PP 1.6e+07 s". Counts beyond the P of --tokens are a power of ten, long times are hours, days or years
with their thousands, never an exponent."""

from __future__ import annotations

import re

import pytest

from _robust import run_main
from advisor.units import fmt_count, fmt_duration, fmt_seconds, fmt_seconds_3g

DAY, YEAR = 86400.0, 365.25 * 86400.0


@pytest.mark.parametrize("n,text", [
    (1e12, "1T"), (300e9, "300B"), (2.5e6, "2.5M"), (999, "999"), (1500, "1.5K"),
    (999.7e12, "1P"),  # rounded to 1e+03T before
    (999e15, "999P"), (1e18, "1e18"), (2.5e21, "2.5e21"),  # 1e+03P, 2.5e+06P before
])
def test_counts_as_tokens_takes_them(n, text):
    assert fmt_count(n) == text


@pytest.mark.parametrize("t,text", [
    (600.0, "10.0 min"), (12.5 * DAY, "12.5 d"), (1.5 * YEAR, "1.5 y"),
    (114030810.9 * DAY, "312,199 y"),  # the train time of 1e18 tokens of gpt2-xl on a DGX A100 (was 114030810.9 d)
])
def test_durations_in_the_largest_unit_with_thousands(t, text):
    assert fmt_duration(t) == text


@pytest.mark.parametrize("t,seconds,three", [
    (5.165, "5.165 s", "5.17 s"), (0.0123, "12.30 ms", "0.0123 s"), (1e-5, "10.0 us", "10.0 us"),
    (9999.0, "9999.000 s", "2.8 h"),
    (16036492.26, "185.6 d", "185.6 d"),  # a step of 999,999,999 sequences: 16036492.260 s and 1.6e+07 s before
])
def test_step_times(t, seconds, three):
    assert (fmt_seconds(t), fmt_seconds_3g(t)) == (seconds, three)


def _plan(*args: str) -> str:
    code, out, err = run_main(["plan", "--model", "gpt2-xl", "--hw", "dgx-a100", "--top", "1", *args])
    assert code == 0, err
    return " ".join(out.split())


def test_a_huge_budget_and_batch_read_without_exponents():
    text = _plan("--tokens", "1e18")
    assert "budget 1e18 tokens" in text
    assert re.search(r" \d{1,3}(,\d{3})+ y \$", text), text  # train time in whole years, then the cost
    text = _plan("--global-batch", "999999999")
    assert re.search(r"fastest fitting plan of each kind: PP \d+\.\d d\b", text), text
    assert re.search(r"none \d+\.\d d ", text), text  # the step column
    assert "e+" not in text
