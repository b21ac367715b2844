"""Renderers: the files a run needs (lock recipe, Accelerate config, launch script), as text, from a recipe."""
