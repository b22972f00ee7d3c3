"""Images a hostile client sends, for the tests of what refuses them."""

from __future__ import annotations

import numpy as np

from loadtest.photos import encode

SCAN = b"\xff\xda"  # a JPEG's SOS marker


def scan_bomb(scans: int, side: int = 256) -> bytes:
    """A grey progressive JPEG of side×side with its last scan repeated until it has `scans`: a decoder decodes once
    a scan, and each repeat is a few bytes (20,000 of them held a decode thread 8.6 s at 1024×1024)."""
    jpeg = encode(np.full((side, side), 128, np.uint8), quality=90, progressive=True)
    last = jpeg.rindex(SCAN)
    return jpeg[:-2] + jpeg[last:-2] * (scans - jpeg.count(SCAN)) + b"\xff\xd9"


def with_scan_markers_before_its_frame(jpeg: bytes, count: int) -> bytes:
    """`jpeg` with an APP2 segment after its SOI holding `count` SOS markers' bytes, as an ICC profile or an EXIF
    thumbnail may: not scans of the image, and not counted as them."""
    payload = b"\xff\xda\x00\x00" * count
    return jpeg[:2] + b"\xff\xe2" + (len(payload) + 2).to_bytes(2, "big") + payload + jpeg[2:]
