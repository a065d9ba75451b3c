#include "dataprep/ingest/url.h"

#include <cctype>

namespace kiln::prep {

void split_url(std::string_view url, std::string* host, std::string* path) {
  host->clear();
  path->clear();
  size_t scheme = url.find("://");
  std::string_view rest = scheme == std::string_view::npos ? url : url.substr(scheme + 3);
  size_t slash = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, slash);
  size_t at = authority.rfind('@');
  if (at != std::string_view::npos) authority = authority.substr(at + 1);
  size_t colon = authority.rfind(':');
  if (colon != std::string_view::npos && authority.find(']') == std::string_view::npos)
    authority = authority.substr(0, colon);
  for (char c : authority)
    host->push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (slash == std::string_view::npos) {
    *path = "/";
    return;
  }
  std::string_view p = rest.substr(slash);
  size_t q = p.find_first_of("?#");
  *path = std::string(p.substr(0, q));
  if (path->empty()) *path = "/";
}

}  // namespace kiln::prep
