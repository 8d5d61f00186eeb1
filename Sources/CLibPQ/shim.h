#include <libpq-fe.h>
#include <libpq/libpq-fs.h>
