"""The terminal wizard: the only package that imports textual.

Screens edit one draft recipe (:mod:`tuner.tui.draft`); validation, planning, rendering
and launching come from the core modules, so whatever the wizard saves replays headless.
"""
