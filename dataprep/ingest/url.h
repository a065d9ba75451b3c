// URLs of documents, as the domain rules (dataprep/tagging/) and the url filter
// (dataprep/filter/) read them. Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace kiln::prep {

// The host (lower-cased, without user info and port) and the path (without query and fragment,
// "/" when empty) of `url`, with or without a scheme.
void split_url(std::string_view url, std::string* host, std::string* path);

}  // namespace kiln::prep
