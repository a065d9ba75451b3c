// A shard sample's <key>.json, as the write stage stores it (docs/PREP.md "Output").
#pragma once

#include <string>

#include "dataprep/ingest/document.h"

namespace kiln::prep::detail {

// The sample's <key>.json bytes: id, domain, domain_by, source, url (when set), tokens (count) and
// the carried fields, keys sorted; exactly nlohmann::json::dump() of that object. Thread-safe.
std::string sample_metadata(const Document& doc);

}  // namespace kiln::prep::detail
