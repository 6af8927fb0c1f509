"""What a drafter says of each proposal: a typed record the loop keeps per call (``CallStats.report``), and the
confidence signal priced wrappers and the router bucket its steps by. A leaf module (no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Report:
    """What a drafter says of its last proposal; the loop keeps one per call (``CallStats.report``). Each drafter
    reports a subclass with its own fields."""

    @property
    def confidence(self) -> int:
        """The drafter's own signal of how far this proposal will be accepted (the length of the context it
        matched, whether it had a row for the root, ...), which a priced wrapper groups its steps by; 0 for
        drafters without one."""
        return 0


@dataclass(frozen=True)
class Matched(Report):
    """A tree retrieved after a match of the context's last ``match_len`` tokens (0: no match), ``tree_nodes``
    nodes."""

    match_len: int = 0
    tree_nodes: int = 0

    @property
    def confidence(self) -> int:
        return self.match_len


NO_REPORT = Report()
