"""Scores and statistics as pure functions: the papers' scores (``metrics``), robustness curves
(``robustness``), uncertainty and rank groups over seeds (``stats``), evaluation beyond accuracy
(``beyond_accuracy``) and one result's values as read (``tables``). Imports ``specs`` and the engine's
test pass only: nothing stateful (no store, no protocols, no runner)."""
