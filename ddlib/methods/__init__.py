"""Where a set comes from: selection (``select``: random, K-Center; ``coresets``: herding, forgetting,
EL2N; ``pruning``: AUM, CCS), synthesis (``dm``: Distribution Matching), the source specs a grid names
(``sources``: built-ins, files, the full data) and what a set cost to make (``cost``)."""
