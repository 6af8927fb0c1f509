"""Experiments: one runner and one summary (:mod:`.runner`), and what only the notebooks' studies need
(replay grids, the DReSD datastores and neighbours, the draftretriever comparison)."""

from .runner import Runner, Variant, run, summarize

__all__ = ["Runner", "Variant", "run", "summarize"]
