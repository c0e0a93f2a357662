"""Leaderboards' machinery: reading per-seed values from MLflow (:mod:`.read`), aggregating and ranking
(:mod:`.rank`), formatting and logging tables (:mod:`.table`). May import store/, scores/, specs/; never protocols/ or report/."""
