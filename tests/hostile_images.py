"""Images a hostile client sends, for the tests of what refuses them."""

from __future__ import annotations

import numpy as np

from loadtest.photos import encode

SCAN = b"\xff\xda"  # a JPEG's SOS marker


def scan_bomb(scans: int, side: int = 256) -> bytes:
    """A grey progressive JPEG of side×side with its last scan repeated until it has `scans`: a decoder decodes once
    a scan, and each repeat is a few bytes (20,000 of them held a decode thread 7.2 s at 1024×1024:
    bench/hostile_images.py)."""
    jpeg = encode(np.full((side, side), 128, np.uint8), quality=90, progressive=True)
    last = jpeg.rindex(SCAN)
    return jpeg[:-2] + jpeg[last:-2] * (scans - jpeg.count(SCAN)) + b"\xff\xd9"


def with_scan_markers_before_its_frame(jpeg: bytes, count: int) -> bytes:
    """`jpeg` with an APP2 segment after its SOI holding `count` SOS markers' bytes, as an ICC profile or an EXIF
    thumbnail may: not scans of the image, and not counted as them."""
    payload = b"\xff\xda\x00\x00" * count
    return jpeg[:2] + b"\xff\xe2" + (len(payload) + 2).to_bytes(2, "big") + payload + jpeg[2:]


def scan_bomb_hiding_its_frame(scans: int, side: int = 256) -> bytes:
    """scan_bomb with RST markers (no length) where a walk that read them as having one would jump past the frame and
    its scans: at each jump's landing, fill bytes and another RST, so that such a walk counts none of them."""
    bomb = scan_bomb(scans, side)
    first = bomb.index(SCAN)
    out = bytearray(b"\xff\xd8\xff\xd0") + bomb[2:first]
    landing = 4 + int.from_bytes(out[4:6], "big")  # where the walk reading "FF D0" as having a length lands
    for scan in (SCAN + part for part in bomb[first:-2].split(SCAN)[1:]):
        if len(out) + len(scan) > landing:
            out += b"\xff" * (landing - len(out)) + b"\xff\xd0"
            landing += 2 + int.from_bytes(scan[:2], "big")  # the scan's own FF DA read as that RST's length
        out += scan
    return bytes(out + b"\xff\xd9")
