"""Failure classes the fuzz suite found that are still open, by class key (``Outcome.class_key``: op | outcome |
torch's exception | ember's exception), each with the likely source and what goes wrong. ``test_op_matches_torch``
skips these classes, so it fails only on new ones; ``test_known_fuzz_failures_still_open`` fails while any of them
still shows. Delete an entry once its defect is fixed (the list was written from ``report.py --cases 20000``).
"""

KNOWN: dict[str, str] = {
}
