"""Where a set comes from: selection (``select``: random, K-Center; ``coresets``: herding, forgetting,
EL2N), synthesis (``dm``: Distribution Matching) and the source specs a grid names (``sources``:
built-ins, files, the full data)."""
