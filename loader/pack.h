// Internal to loader/: packing — cutting sequences of seq_len + 1 tokens out of a domain's packed
// token stream (its decoded units one after the other), and the mixture decision of which domain
// fills each sequence slot.
//
// Pure functions of their inputs; the loader's packer thread calls them without its lock, and
// fetching a unit that is not decoded yet is the caller's business (UnitFetch).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/status.h"
#include "loader/decode.h"
#include "loader/loader.h"

namespace kiln::loader::detail {

// A position in a domain's packed stream.
struct Pos {
  uint64_t unit = 0;  // unit seq
  uint64_t doc = 0;   // document index within the unit
  uint64_t tok = 0;   // offset into the document's stored tokens
};

// The domain (index into `weights`) that fills sequence slot `index`: the same on every rank,
// from the seed's low-discrepancy mixture sequence. weights: normalised, by domain id; the last
// domain with weight > 0 catches rounding.
int choose_domain(const std::vector<double>& weights, uint64_t seed, uint64_t index);

// Unit `seq` of the domain being packed, decoded; nullptr when the batch must be abandoned.
using UnitFetch = std::function<std::shared_ptr<const Unit>(uint64_t seq)>;

enum class FillResult { kFilled, kFailed, kAbandoned };

// Copies the next `width` tokens of one domain's stream, from *pos on, into dst and appends one
// DocSpan per document piece to *spans; advances *pos. loss (may be null): the tokens' loss
// flags (Unit::loss, 1 where a unit has none). *current caches the unit in use between
// calls. kFailed: a unit failed to decode, *error is its status. kAbandoned: fetch gave nullptr.
FillResult fill_row(const UnitFetch& fetch, std::shared_ptr<const Unit>* current, Pos* pos,
                    int64_t width, uint32_t* dst, std::vector<DocSpan>* spans, Status* error,
                    uint8_t* loss = nullptr);

}  // namespace kiln::loader::detail
