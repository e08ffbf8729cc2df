"""PIL's decompression-bomb limit: one message for an image above it, whichever source decoded it."""

from __future__ import annotations

import re


def is_decompression_bomb(exc: BaseException) -> bool:
    from PIL import Image  # local: PIL is imported by the jobs that decode, not at DAG time

    return isinstance(exc, (Image.DecompressionBombError, Image.DecompressionBombWarning))  # the warning: if an error


def decompression_bomb(exc: BaseException, what: str, set_limit_in: str) -> tuple[str, str]:
    """(message, fix) for PIL refusing ``what`` (a file, a shard member); ``set_limit_in``: where
    this source's user can raise the limit before images are opened."""
    from PIL import Image  # local: as above

    claimed = re.search(r"\((\d+) pixels\)", str(exc))
    pixels = f"{int(claimed.group(1)):,} pixels" if claimed else "more pixels than PIL allows"
    limit = Image.MAX_IMAGE_PIXELS
    refused = f"{2 * limit:,}" if isinstance(exc, Image.DecompressionBombError) else f"{limit:,}"
    message = (
        f"{what} is {pixels}, above PIL's decompression-bomb limit of {refused} pixels "
        f"(PIL.Image.MAX_IMAGE_PIXELS = {limit:,}; PIL refuses twice that, warns above it)"
    )
    fix = (
        f"if the image is legitimate, resize it, or {set_limit_in} "
        f"`PIL.Image.MAX_IMAGE_PIXELS = {int(claimed.group(1)) if claimed else 'None'}` "
        "(None: no limit) before it opens images; otherwise remove it"
    )
    return message, fix
