"""Widgets reused by several screens: form fields bound to the draft, the memory plan, the step bar."""
