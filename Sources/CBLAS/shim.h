// Debian's libblas-dev installs cblas.h through the alternatives system; on some
// machines that link dangles, so fall back to the reference header it points at.
#if __has_include(<cblas.h>)
#include <cblas.h>
#else
#include <cblas-netlib.h>
#endif
