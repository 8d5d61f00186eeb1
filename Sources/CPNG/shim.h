// libpng's simplified API (png_image_*) reports errors through the png_image's message instead of
// longjmp, which Swift could not unwind through.
#include <png.h>
