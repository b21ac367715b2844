"""The planner's worst image against transformers 5.24's own processor rules: no image within the data's pixel bound
gets more tiles than the plan, and the image the plan names gets them all.  The rules are the image processors' own
functions, read from their module (which imports torchvision, absent here: the functions themselves need torch
only)."""
from __future__ import annotations

import ast
import math
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.planner.image_tokens import (IDEFICS3_EDGE_TILES, LLAMA4_MAX_TILES, idefics3_grid, llama4_canvas,
                                       llama4_smallest)


def _functions(module: str, names: tuple[str, ...]) -> dict:
    """``names`` as defined in transformers' ``module`` (a path under transformers/models), executed alone."""
    import torch
    import transformers
    from transformers.image_utils import SizeDict

    source = (Path(transformers.__file__).parent / "models" / module).read_text()
    tree = ast.parse(source)
    tree.body = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    namespace = {"torch": torch, "math": math, "defaultdict": defaultdict, "lru_cache": lru_cache,
                 "SizeDict": SizeDict}
    exec(compile(tree, module, "exec"), namespace)  # noqa: S102 - transformers' own code, as installed
    assert set(names) <= set(namespace)
    return namespace


@pytest.fixture(scope="module")
def llama4_processor_tiles():
    """The tiles ``Llama4ImageProcessor._preprocess`` makes of an image: the canvas ``get_best_fit`` picks among
    ``find_supported_resolutions(max_patches)``, split into tiles, and the global tile beside more than one."""
    import torch
    from transformers.image_utils import SizeDict

    rules = _functions("llama4/image_processing_llama4.py",
                       ("get_factors", "find_supported_resolutions", "get_best_fit"))

    def tiles(height: int, width: int, side: int) -> int:
        canvases = torch.tensor(rules["find_supported_resolutions"](LLAMA4_MAX_TILES,
                                                                    SizeDict(height=side, width=side)))
        canvas = rules["get_best_fit"]((height, width), canvases)
        cells = int(canvas[0]) // side * (int(canvas[1]) // side)
        return cells + (cells > 1)
    return tiles


def _planned_tiles(side: int, pixels: int) -> int:
    """The tiles the plan's Llama 4 tower runs: a tiny tower's count, as tuner.planner.tower builds it."""
    from tuner.planner.tower import _llama4

    return _llama4({"vision_config": {"model_type": "llama4_vision_model", "image_size": side, "patch_size": 8}},
                   pixels).tiles


@settings(max_examples=60, deadline=None)
@given(side=st.sampled_from([8, 32, 336]), pixels=st.integers(1, 6000), aspect=st.floats(-6, 6))
def test_llama4_no_image_within_the_bound_gets_more_tiles_than_planned(llama4_processor_tiles, side, pixels,
                                                                       aspect):
    """Any image of at most ``pixels`` (its shape drawn on a log scale of aspect ratios) gets no more tiles than
    planned, and the smallest image of the planned canvas gets them all."""
    planned = _planned_tiles(side, pixels)
    height = max(1, min(pixels, round(math.sqrt(pixels * math.exp(aspect)))))
    width = max(1, pixels // height)
    assert llama4_processor_tiles(height, width, side) <= planned
    rows, cols = llama4_canvas(side, pixels)
    assert llama4_smallest(rows, side) * llama4_smallest(cols, side) <= pixels
    assert llama4_processor_tiles(llama4_smallest(rows, side), llama4_smallest(cols, side), side) == planned


def test_llama4_plans_every_tile_once_a_strip_of_tiles_fits():
    assert _planned_tiles(336, 336 * 336) == 17  # a 1 x 5041 px strip already takes 16 tiles and the global one
    assert _planned_tiles(336, 5040) == 16
    assert _planned_tiles(336, 337) == 3  # 1 x 337 px: two tiles and the global one
    assert _planned_tiles(336, 336) == 1


@pytest.fixture(scope="module", params=["idefics3", "smolvlm"])
def idefics3_processor(request):
    """The PIL image processor of Idefics 3 or SmolVLM (the same rules), at a tiny tile and 4 tiles a longest edge."""
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    cls = {"idefics3": Idefics3ImageProcessorPil, "smolvlm": SmolVLMImageProcessorPil}[request.param]
    return cls(size={"longest_edge": IDEFICS3_EDGE_TILES * 32}, max_image_size={"longest_edge": 32})


def _idefics3_tower():
    from tuner.planner.tower import _idefics3

    return _idefics3({"vision_config": {"model_type": "idefics3_vision", "image_size": 32, "patch_size": 8}})


@settings(max_examples=40, deadline=None)
@given(height=st.integers(1, 5000), width=st.integers(1, 5000))
def test_idefics3_no_image_gets_more_tiles_than_planned(idefics3_processor, height, width):
    """Every image's longest edge is resized to the processor's longest_edge, so no shape gets more tiles than the
    planned square, whatever its pixels (get_number_of_image_patches: the processor's own count)."""
    tiles, _, _ = idefics3_processor.get_number_of_image_patches(height, width)
    assert max(tiles, 1) <= _idefics3_tower().tiles


def test_idefics3_plans_the_square_image_the_processor_splits(idefics3_processor):
    from PIL import Image

    processed = idefics3_processor(Image.new("RGB", (7, 7)), return_row_col_info=True)
    rows, cols = idefics3_grid()
    assert (processed["rows"][0][0], processed["cols"][0][0]) == (rows, cols)
    assert len(processed["pixel_values"][0]) == _idefics3_tower().tiles  # 16 tiles and the global image


def test_idefics3_markers_are_the_processors_prompt_less_its_image_tokens():
    """The prompt SmolVLMProcessor (and Idefics3Processor) puts in place of an image, each tag and newline a token."""
    import re

    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    tower = _idefics3_tower()
    rows, cols = idefics3_grid()
    prompt = get_image_prompt_string(rows, cols, tower.tokens // tower.tiles, "<fake_token_around_image>", "<image>",
                                     "<global-img>")
    pieces = re.findall(r"<[^>]+>|\n", prompt)
    assert pieces.count("<image>") == tower.tokens and len(pieces) == tower.sequence_tokens
