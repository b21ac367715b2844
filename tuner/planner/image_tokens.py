"""How an image processor cuts one image for its tower, as transformers 5.24's processors do: the size a
dynamic-resolution image is resized to, or the tiles a tiling processor splits it into.  The planner plans the
worst image the data allows (``data.max_image_pixels``); :mod:`tuner.planner.tower` turns these counts into
patches, image tokens and bytes.
"""
from __future__ import annotations

import math

QWEN_MAX_PIXELS = 28 * 28 * 1280  # Qwen2VLImageProcessor's size["longest_edge"]
LLAMA4_MAX_TILES = 16  # Llama4ImageProcessor.max_patches: the most tiles of an image, before its global tile


def qwen_side(factor: int, max_image_pixels: int) -> int:
    """The side of a square image of the most pixels allowed after ``Qwen2VLImageProcessor.smart_resize``: rounded
    to a multiple of ``factor`` (patch_size x merge_size), floored instead where rounding passes ``max_pixels``."""
    side = math.isqrt(min(QWEN_MAX_PIXELS, max_image_pixels))
    resized = max(factor, round(side / factor) * factor)
    if resized * resized > QWEN_MAX_PIXELS:
        resized = max(factor, math.floor(side / factor) * factor)
    return resized


def llama4_canvas(tile: int, max_image_pixels: int, max_tiles: int = LLAMA4_MAX_TILES) -> tuple[int, int]:
    """The canvas (tiles high, tiles wide) of the image of at most ``max_image_pixels`` pixels that
    ``Llama4ImageProcessor`` cuts into the most tiles.

    The processor picks a canvas of ``rows x cols <= max_patches`` cells of ``tile`` px (``find_supported_resolutions``)
    by ``get_best_fit``: the smallest upscale of at least 1, the least area among equals.  The smallest image that
    gets a canvas of ``rows x cols`` is one pixel over ``rows - 1`` and ``cols - 1`` tiles on its sides (no smaller
    canvas holds it, and the canvas itself is its smallest upscale), so a strip of ``(max_patches - 1) * tile + 1``
    pixels already gets all ``max_patches`` tiles.  The shape of the image is not known, so the worst shape within
    the bound is planned."""
    return max(((rows, cols) for rows in range(1, max_tiles + 1) for cols in range(1, max_tiles // rows + 1)
                if llama4_smallest(rows, tile) * llama4_smallest(cols, tile) <= max_image_pixels),
               key=lambda canvas: canvas[0] * canvas[1])


def llama4_smallest(cells: int, tile: int) -> int:
    """The fewest pixels on a side that ``Llama4ImageProcessor`` spreads over ``cells`` tiles."""
    return (cells - 1) * tile + 1


IDEFICS3_EDGE_TILES = 4  # Idefics3ImageProcessor's size["longest_edge"] over its max_image_size: 4 * 364 over 364


def idefics3_grid(edge_tiles: int = IDEFICS3_EDGE_TILES) -> tuple[int, int]:
    """The rows and columns of tiles ``Idefics3ImageProcessor`` / ``SmolVLMImageProcessor`` split the worst image
    into, before the global image (``get_number_of_image_patches``): every image is resized so that its longest edge
    is ``size["longest_edge"]`` (up or down, whatever its pixels), then to multiples of ``max_image_size`` (the
    tower's ``image_size``), so a square image takes the most, ``longest_edge / max_image_size`` a side; (0, 0) when
    one tile holds it.  The processor's own file is not read: the ratio is planned at the class defaults' 4."""
    return (edge_tiles, edge_tiles) if edge_tiles > 1 else (0, 0)
