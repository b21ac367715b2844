"""The image demo's task (``builtin:shapes``): name the shape drawn in a small picture and its colour.

Drawn here with Pillow, seeded: a circle, a square or a triangle in one of four colours, its size and place
jittered, on white.  Each row is an ``image_prompt_answer`` sample whose image is a PNG file beside the samples
(a path relative to the data file, as a user's own data would be).  Every picture differs, so held-out exact match
measures the skill; a guess without looking gets 1 in 12.
"""
from __future__ import annotations

import random

PROMPT = "what is drawn?"
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 30), "blue": (30, 60, 220), "yellow": (230, 200, 20)}
SHAPES = ("circle", "square", "triangle")
SIDE = 32  # pixels: the demo model's tower sees 32x32 (tuner.catalog.demo.DEMO_VLM_IMAGE)


def draw_shape(shape: str, colour: str, rng: random.Random):
    """One picture of ``shape`` in ``colour``: radius 10-13 pixels, centred within 2 pixels."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SIDE, SIDE), (255, 255, 255))
    pen = ImageDraw.Draw(image)
    r = rng.randint(10, 13)
    x, y = SIDE // 2 + rng.randint(-2, 2), SIDE // 2 + rng.randint(-2, 2)
    fill = COLOURS[colour]
    if shape == "circle":
        pen.ellipse((x - r, y - r, x + r, y + r), fill=fill)
    elif shape == "square":
        pen.rectangle((x - r, y - r, x + r, y + r), fill=fill)
    else:
        pen.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=fill)
    return image


def shape_samples(count: int, seed: int = 0) -> list[dict]:
    """``count`` samples: {"image": a PIL image, "prompt": PROMPT, "answer": "red circle"} (the writer of the
    built-in sources saves each image as a file and puts its relative path in its place)."""
    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
        samples.append({"image": draw_shape(shape, colour, rng), "prompt": PROMPT, "answer": f"{colour} {shape}"})
    return samples
