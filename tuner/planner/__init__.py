"""Memory planning: predict peak memory per device before anything runs, and find the cheapest plan that fits.

``plan(recipe)`` is pure arithmetic (no torch); ``advise(recipe)`` searches the ladder of memory tactics;
``tuner.planner.simulate`` traces a real step on fake tensors to check the arithmetic.
"""
from tuner.planner.memory import DevicePlan, MemoryPlan, plan

__all__ = ["DevicePlan", "MemoryPlan", "plan"]
