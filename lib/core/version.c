/* version.c: the library's version at run time.
 *
 * gmr_version() = GMR_VERSION_MAJOR "." GMR_VERSION_MINOR "." GMR_VERSION_PATCH
 * of the header the library was built with, which configure.ac also reads
 * (so PACKAGE_VERSION = gmr_version(); tests/util checks it).
 */
#include "core/internal.h"

#define GMR__STR_(x) #x
#define GMR__STR(x)  GMR__STR_(x)

const char *gmr_version(void) {
  return GMR__STR(GMR_VERSION_MAJOR) "." GMR__STR(GMR_VERSION_MINOR) "." GMR__STR(
      GMR_VERSION_PATCH);
}
