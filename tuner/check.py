"""One environment check's result, on the ground floor so the TUI and preflight can show checks
without importing the doctor (which reaches the planner and heavy libraries)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""

    def line(self) -> str:
        """One line for the terminal: status, name, what was found, and what to do."""
        mark = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}[self.status]
        fix = f"  -> {self.fix}" if self.fix and self.status != "ok" else ""
        return f"{mark}  {self.name:<18} {self.detail}{fix}"
