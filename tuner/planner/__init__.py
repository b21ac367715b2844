"""Memory planning: predict peak memory per device before anything runs, and find the cheapest plan that fits.

``plan(recipe)`` is pure arithmetic (no torch); ``advise(recipe)`` searches the ladder of memory tactics;
``next_step(recipe)`` is the advisor's next rung, as the recipe it leads to, for an out-of-memory handler;
``topology(recipe)`` the fewest GPUs of the recipe's type on which it fits without offload;
``tuner.loading.simulate``, a floor up, traces the model that trains on fake tensors to check the arithmetic.
"""
from tuner.planner.advisor import Advice, Step, advise, largest_micro_batch, next_step
from tuner.planner.topology import topology
from tuner.planner.items import DevicePlan, MemoryPlan
from tuner.planner.memory import plan

__all__ = ["Advice", "DevicePlan", "MemoryPlan", "Step", "advise", "largest_micro_batch", "next_step", "plan", "topology"]
