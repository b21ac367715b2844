"""Memory planning: predict peak memory per device before anything runs, and find the cheapest plan that fits.

``plan(recipe)`` is pure arithmetic (no torch); ``advise(recipe)`` searches the ladder of memory tactics;
``next_rung(recipe)`` names the advisor's next step for an out-of-memory handler;
``tuner.planner.simulate`` traces a real step on fake tensors to check the arithmetic.
"""
from tuner.planner.advisor import Advice, advise, largest_micro_batch, next_rung
from tuner.planner.memory import DevicePlan, MemoryPlan, plan

__all__ = ["Advice", "DevicePlan", "MemoryPlan", "advise", "largest_micro_batch", "next_rung", "plan"]
