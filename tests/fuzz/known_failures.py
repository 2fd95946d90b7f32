"""Failure classes the fuzz suite found that are still open, by class key (``Outcome.class_key``: op | outcome |
torch's exception | ember's exception), each with a short note of the likely source. ``test_op_matches_torch``
skips these classes, so it fails only on new ones; ``test_known_fuzz_failures_still_open`` fails while any of them
still shows. Delete an entry once its defect is fixed."""

KNOWN: dict[str, str] = {}
