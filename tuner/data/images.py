"""Image-text samples: the two layouts, the bounded opening of every image, the check of each row, and the batches
the model's own processor makes from them.

``image_prompt_answer``: an ``image`` (a path relative to the data file, or a datasets ``Image`` value), a
``prompt`` and its ``answer``.  ``image_chat``: ``messages`` whose user turns hold image parts
(``{"type": "image"}``, with its own ``"image"`` path, or filled in order from an ``images`` column) and text parts.
Images are outside input: each is read to at most :data:`MAX_IMAGE_BYTES` and decoded only once its header says
it holds no more than ``data.max_image_pixels`` pixels (Pillow's decompression-bomb limit is set to the same bound),
so a huge or hostile picture is refused before it is decoded.  The batches come from TRL's vision-language collator
(the processor and its chat template build the inputs; labels mask the prompt and its image tokens).
"""
from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

IMAGE_COLUMNS = {"image_prompt_answer": {"image", "prompt", "answer"}, "image_chat": {"messages"}}
MAX_IMAGE_PIXELS = 4096 * 4096  # data.max_image_pixels' default: 16.8M pixels, a 48 MiB RGB picture once decoded
MAX_IMAGE_BYTES = 64 * 2**20  # one image file; a larger one is refused unread


class ImageProblem(ValueError):
    """An image that cannot be used; the message says why (the caller names the file, line and field)."""


def is_image_format(data_format: str) -> bool:
    return data_format in IMAGE_COLUMNS


def open_image(value: Any, base: Path | None, max_pixels: int = MAX_IMAGE_PIXELS):
    """The RGB picture ``value`` names -- a path (relative to ``base``, the data file's folder), a datasets Image
    value ({"bytes", "path"}) or a PIL image -- read within the bounds; :class:`ImageProblem` says why not."""
    from PIL import Image, UnidentifiedImageError

    from tuner.fileio import NotARegularFile, TooLarge, read_limited

    if hasattr(value, "size") and hasattr(value, "convert"):  # decoded already (a datasets Image column)
        _check_pixels(value.size, max_pixels)
        return value.convert("RGB")
    if isinstance(value, dict) and value.get("bytes") is not None:
        raw, name = value["bytes"], "the image bytes"
    else:
        path = value.get("path") if isinstance(value, dict) else value
        if not isinstance(path, str) or not path:
            raise ImageProblem("no image: give a path to an image file (relative to the data file)")
        file = Path(path) if base is None or Path(path).is_absolute() else base / path
        try:
            raw = read_limited(file, MAX_IMAGE_BYTES, pipes=False)
        except FileNotFoundError:
            raise ImageProblem(f"{path}: no such image file") from None
        except TooLarge:
            raise ImageProblem(f"{path}: the file is over {MAX_IMAGE_BYTES} bytes, the most an image may be") from None
        except NotARegularFile as exc:
            raise ImageProblem(f"{path}: not a regular file ({exc.args[1] if len(exc.args) > 1 else exc})") from None
        except OSError as exc:
            raise ImageProblem(f"{path}: cannot be read ({exc.strerror or exc})") from None
        name = path
    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = max_pixels  # Pillow refuses twice this at open, before decoding
    try:
        with warnings.catch_warnings():  # between once and twice the bound Pillow only warns: refused below
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(raw))
        _check_pixels(image.size, max_pixels)
        image.load()
        return image.convert("RGB")
    except Image.DecompressionBombError:
        raise ImageProblem(f"{name}: {_too_many(max_pixels)}") from None
    except UnidentifiedImageError:
        raise ImageProblem(f"{name}: not an image file Pillow can read (PNG, JPEG, WebP, ...)") from None
    except ImageProblem as exc:
        raise ImageProblem(f"{name}: {exc}") from None
    except (OSError, ValueError, SyntaxError) as exc:  # a truncated or damaged file
        raise ImageProblem(f"{name}: the image is damaged ({exc})") from None
    finally:
        Image.MAX_IMAGE_PIXELS = previous


def _too_many(max_pixels: int, size: tuple[int, int] | None = None) -> str:
    held = f"{size[0]}x{size[1]} pixels, " if size else ""
    return (f"the image is {held}over the bound of {max_pixels} pixels (data.max_image_pixels, default "
            f"{MAX_IMAGE_PIXELS}); shrink it, or raise data.max_image_pixels")


def _check_pixels(size: tuple[int, int], max_pixels: int) -> None:
    if size[0] * size[1] > max_pixels:
        raise ImageProblem(_too_many(max_pixels, size))


def _parts(content) -> list[dict] | None:
    return content if isinstance(content, list) and all(isinstance(part, dict) for part in content) else None


def row_images(sample: dict[str, Any], data_format: str) -> list[tuple[str, Any]]:
    """(field, value) of every image a row names, in the order its placeholders take them; ValueError (the reason)
    for a row whose layout is wrong -- among them more (or fewer) images than placeholders."""
    if data_format == "image_prompt_answer":
        for key in ("prompt", "answer"):
            if not isinstance(sample.get(key), str) or not sample[key].strip():
                raise ValueError(f"'{key}' is missing or empty")
        return [("image", sample.get("image"))]
    messages = sample.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise ValueError("'messages' is missing or not a list of messages")
    listed = sample.get("images") or []
    if not isinstance(listed, list):
        raise ValueError("'images' is not a list of images")
    found, placeholders = [], 0
    for turn, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, str):
            continue
        parts = _parts(content)
        if parts is None:
            raise ValueError(f"messages[{turn}].content is neither text nor a list of parts")
        for index, part in enumerate(parts):
            if part.get("type") == "image":
                if message.get("role") != "user":
                    raise ValueError(f"messages[{turn}] holds an image in a {message.get('role')!r} turn; images go in "
                                     "user turns")
                own = part.get("image") or part.get("path")
                if own is not None:
                    found.append((f"messages[{turn}].content[{index}].image", own))
                else:
                    placeholders += 1
                    if placeholders <= len(listed):
                        found.append((f"images[{placeholders - 1}]", listed[placeholders - 1]))
            elif part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"messages[{turn}].content[{index}] is neither an image part nor a text part")
    if len(listed) != placeholders:
        raise ValueError(f"'images' lists {len(listed)} image(s) for {placeholders} image placeholder(s) in the "
                         "messages; give one image per {\"type\": \"image\"} part")
    if not found:
        raise ValueError("the row holds no image; image_chat rows need one (text-only rows belong in chat data)")
    if messages[-1].get("role") != "assistant":
        raise ValueError("the conversation does not end with the assistant's answer")
    return found


def image_row_problem(sample: dict[str, Any], data_format: str, base: Path | None,
                      max_pixels: int = MAX_IMAGE_PIXELS) -> str | None:
    """Why one row cannot be trained on (its layout, or an image that is missing, unreadable, not an image or over
    the pixel bound), naming the field; None when it can."""
    try:
        images = row_images(sample, data_format)
    except ValueError as exc:
        return str(exc)
    for field, value in images:
        try:
            open_image(value, base, max_pixels)
        except ImageProblem as exc:
            return f"'{field}': {exc}"
    return None


def conversation(sample: dict[str, Any], data_format: str, base: Path | None,
                 max_pixels: int = MAX_IMAGE_PIXELS) -> tuple[list[dict], list[dict], list]:
    """A row as TRL's prompt-completion layout: (prompt messages, completion messages, the opened images in
    placeholder order); image parts become bare ``{"type": "image"}`` placeholders."""
    images = [open_image(value, base, max_pixels) for _, value in row_images(sample, data_format)]
    if data_format == "image_prompt_answer":
        prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": sample["prompt"]}]}]
        return prompt, [{"role": "assistant", "content": sample["answer"]}], images
    messages = []
    for message in sample["messages"]:
        parts = _parts(message["content"])
        content = message["content"] if parts is None else [
            {"type": "image"} if part["type"] == "image" else {"type": "text", "text": part["text"]} for part in parts]
        messages.append({"role": message["role"], "content": content})
    return messages[:-1], messages[-1:], images


class ImageCollator:
    """Batches of image-text rows for the Trainer: each row's images opened within the bounds, then TRL's
    vision-language collator (the processor and its chat template make input ids, pixel values and labels that
    learn the answer only)."""

    def __init__(self, processor, data_format: str, base: Path | None, max_length: int,
                 max_pixels: int = MAX_IMAGE_PIXELS, train_on_prompt: bool = False):
        from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

        self.data_format, self.base, self.max_pixels = data_format, base, max_pixels
        self.collate = DataCollatorForVisionLanguageModeling(processor, max_length=max_length,
                                                             completion_only_loss=not train_on_prompt)

    def __call__(self, rows: list[dict]) -> dict:
        examples = []
        for row in rows:
            prompt, completion, images = conversation(row, self.data_format, self.base, self.max_pixels)
            examples.append({"prompt": prompt, "completion": completion, "images": images})
        return self.collate(examples)


def image_collator(recipe, processor, data_format: str) -> ImageCollator | None:
    """The recipe's collator for image-text rows; None for text data (an image-text model trained on text alone
    takes the text collator)."""
    if not is_image_format(data_format):
        return None
    return ImageCollator(processor, data_format, data_folder(recipe.data.source), recipe.training.max_seq_length,
                         recipe.data.max_image_pixels, recipe.data.train_on_prompt)


def data_folder(source: str) -> Path | None:
    """The folder image paths in ``source``'s rows are relative to: the data file's (a built-in's, or a local
    file's); None for a hub dataset (its images are Image values)."""
    from tuner.data.sources import resolve_source

    loader, argument = resolve_source(source)
    return None if loader == "hub" else Path(argument).parent
