/* A batch's JPEG headers read by nvJPEG in one call (app/codecs/nvjpeg.py's direct decoder).
 *
 * Called from Python through ctypes.CDLL, which gives the GIL up for the call: the batch's parse, size and
 * hardware check, three nvJPEG calls an image, run without it, where calling each through ctypes held the GIL for
 * every one (giving it up and taking it back for each waits for the event loop's Python each time). nvJPEG's
 * functions come as pointers from the library the process has loaded, so nothing is linked here.
 */
#include <stddef.h>
#include <stdint.h>

typedef int (*parse_header_t)(void *handle, const unsigned char *data, size_t length, void *parsed);
typedef int (*frame_dimensions_t)(void *parsed, unsigned *width, unsigned *height);
typedef int (*batched_supported_t)(void *handle, void *parsed, int *unsupported);

#define CG_UNSUPPORTED (-1) /* parsed, and not an image the hardware decoder takes (nvJPEG's statuses are >= 0) */

/* For each of the k images at addresses[i] (lengths[i] bytes): statuses[i] 0 and its size in widths[i] and
 * heights[i] where the hardware decodes it; nvJPEG's status where its header does not parse; CG_UNSUPPORTED where
 * it parses and the hardware does not take it (or its size or check fails). `parsed` is the caller's
 * nvjpegJpegStream_t, reused image after image. */
void cg_read_headers(parse_header_t parse, frame_dimensions_t dimensions, batched_supported_t supported,
                     void *handle, void *parsed, int k, const uint64_t *addresses, const uint64_t *lengths,
                     int32_t *statuses, uint32_t *widths, uint32_t *heights) {
    for (int i = 0; i < k; i++) {
        unsigned width = 0, height = 0;
        int unsupported = 1;
        widths[i] = heights[i] = 0;
        statuses[i] = parse(handle, (const unsigned char *)(uintptr_t)addresses[i], (size_t)lengths[i], parsed);
        if (statuses[i] != 0) continue;
        if (dimensions(parsed, &width, &height) != 0 || supported(handle, parsed, &unsupported) != 0 ||
            unsupported != 0 || width == 0 || height == 0) {
            statuses[i] = CG_UNSUPPORTED;
            continue;
        }
        widths[i] = width;
        heights[i] = height;
    }
}
