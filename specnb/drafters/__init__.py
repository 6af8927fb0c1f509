"""Drafters: one module per speculation method, all behind :class:`~specnb.drafters.base.Drafter`."""

from .base import DecodeState, Drafter
from .context import ContextNgramDrafter

__all__ = ["ContextNgramDrafter", "DecodeState", "Drafter"]
