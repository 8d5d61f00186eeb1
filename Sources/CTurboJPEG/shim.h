// TurboJPEG returns error codes (tjGetErrorStr2/tjGetErrorCode) where libjpeg's own API longjmps out of
// its error handler, which Swift could not unwind through.
#include <stddef.h>
#include <turbojpeg.h>
