#include "headers.h"

namespace ladle::device {

// headers() itself is generated from the .cuh files (embed.cmake).
std::vector<std::pair<std::string, std::string>> headers_for(const std::string& source) {
  std::vector<std::pair<std::string, std::string>> used;
  for (const auto& header : headers())
    if (source.find("#include <" + header.first + ">") != std::string::npos) used.push_back(header);
  return used;
}

}  // namespace ladle::device
