// BLIS (Debian's libblis-pthread-dev), through its CBLAS interface: docs/training.md says why BLIS and not
// OpenBLAS. The header comes from the pthread build's own directory, not through the alternatives system,
// so it always matches the library linked (-lblis).
//
// BLIS's cblas.h defines _POSIX_C_SOURCE before its own system includes, which hides glibc's default
// extensions (struct tm's tm_gmtoff and tm_zone): a module built so disagrees with Swift's Glibc module. So
// the C library's headers come first, with the defaults every other module sees.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <blis-pthread/cblas.h>

// The few functions of BLIS's own API Attune asks at run time; blis.h would declare them, but it repeats
// cblas.h's declarations and cannot be included beside it.
BLIS_EXPORT_BLIS dim_t bli_thread_get_num_threads(void);
BLIS_EXPORT_BLIS void bli_thread_set_num_threads(dim_t value);
BLIS_EXPORT_BLIS char *bli_info_get_version_str(void);
BLIS_EXPORT_BLIS int bli_arch_query_id(void);
BLIS_EXPORT_BLIS char *bli_arch_string(int id);
