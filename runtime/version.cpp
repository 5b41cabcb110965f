#include "version.h"

#ifndef LADLE_VERSION_STRING
#define LADLE_VERSION_STRING "0.0.0"
#endif

namespace ladle {

std::string version() {
  return LADLE_VERSION_STRING;
}

}  // namespace ladle
